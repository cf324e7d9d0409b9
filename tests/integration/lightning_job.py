"""A small Lightning program for the integration tests: `python lightning_job.py STRATEGY STAGE`."""
import json
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import zerotune.lightning  # noqa: F401  (registers "deepspeed_autotune")


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main():
    name, stage = sys.argv[1], int(sys.argv[2])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    strategy = (zerotune.lightning.AutotuneDeepSpeedStrategy(stage=stage) if name == "object"
                else name)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Regressor()
    trainer.fit(model, data)
    engine = trainer.strategy.model
    print(json.dumps({"rank": trainer.global_rank, "loss": float(trainer.callback_metrics["loss"]),
                      "stage": engine.zero_optimization_stage(), "device": str(engine.device),
                      "strategy": type(trainer.strategy).__name__}), flush=True)


if __name__ == "__main__":
    main()
