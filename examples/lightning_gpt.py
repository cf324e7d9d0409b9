"""The bundled GPT as a LightningModule with a DataModule, trained with zerotune's DeepSpeed strategy.

    python examples/lightning_gpt.py --devices 2 --model tiny --max-steps 20          # CPU or GPU

The first run tunes (ZeRO stage, micro-batch and accumulation at the global batch
batch-size x devices) and caches the result; later runs train with it at once. On a machine
without GPUs it trains on CPU (DeepSpeed's CPU accelerator, gloo). The micro-batch is the
DataModule's ``batch_size`` attribute, where Lightning's BatchSizeFinder also looks for it.
"""

import argparse

import lightning as L
import torch
from gpt import GPT, MODELS, SyntheticTokens  # beside this script: its folder is on sys.path
from torch.utils.data import DataLoader

import zerotune.lightning  # noqa: F401  (registers strategy="deepspeed_autotune")


class GPTModule(L.LightningModule):
    def __init__(self, model: str = "small", lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = GPT(*MODELS[model])

    def training_step(self, tokens, batch_idx):
        loss = self.net(tokens)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class TokenData(L.LightningDataModule):
    def __init__(self, model: str = "small", batch_size: int = 8):
        super().__init__()
        self.batch_size = batch_size
        vocab, _, _, _, seq_len = MODELS[model]
        self.data = SyntheticTokens(vocab, seq_len)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--stage", type=int, default=None, help="fix the ZeRO stage (default: tune it)")
    parser.add_argument("--no-tune", action="store_true", help="train with --stage (default 2), no tuning")
    parser.add_argument("--retune", action="store_true", help="tune again even if a result is cached")
    parser.add_argument("--cache-dir", default=None, help="where tuned configs are kept")
    args = parser.parse_args()
    accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    stage = {} if args.stage is None else {"stage": args.stage}
    strategy = zerotune.lightning.AutotuneDeepSpeedStrategy(
        autotune=not args.no_tune, retune=args.retune, cache_dir=args.cache_dir, **stage
    )
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=args.devices,
        strategy=strategy,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        log_every_n_steps=10,
    )
    trainer.fit(GPTModule(args.model), TokenData(args.model, args.batch_size))
    if trainer.global_rank == 0:
        result = strategy.tuning_result  # the trials behind the config (None when not tuned)
        if result is not None and result.best is not None:
            print(f"tuned: {result.best.name}, {len(result.trials)} trials, results in {result.results_dir}")
        print(f"final loss {float(trainer.callback_metrics['loss']):.4f}", flush=True)


if __name__ == "__main__":
    main()
