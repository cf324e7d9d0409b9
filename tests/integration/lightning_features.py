"""Lightning DeepSpeed features through AutotuneDeepSpeedStrategy on CPU:
`python lightning_features.py SCENARIO[,SCENARIO...] WORKDIR`. The scenarios run one after another
in the same two processes (one launch, as a user's script may fit several Trainers), each in a
fresh Trainer; each rank writes WORKDIR/<scenario>/rank<N>.json, or rank<N>.error with the
traceback where the scenario failed, and goes on to the next (files, not stdout: the ranks share
one stdout, where their lines can interleave). Only a scenario that fails on purpose runs alone."""

import json
import os
import sys
import traceback

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from zerotune.lightning import AutotuneDeepSpeedStrategy  # importing registers "deepspeed_autotune"


class Regressor(L.LightningModule):
    def __init__(
        self, scheduler: bool = False, sharded: bool = False, two_optimizers: bool = False, cpu_adam: bool = False
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = None if sharded else self._build()

    @staticmethod
    def _build():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def configure_model(self):
        if self.net is None:  # under ZeRO-3 this runs inside deepspeed.zero.Init: built sharded
            self.net = self._build()
            self.built_sharded = hasattr(next(self.net.parameters()), "ds_id")

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == 0:
            p = next(self.net.parameters())
            self.shard = (int(getattr(p, "ds_numel", -1)), int(p.numel()))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        if self.hparams.cpu_adam:  # what DeepSpeed requires with ZeRO-Offload, as in Lightning's docs
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=1e-2)
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        if self.hparams.two_optimizers:
            return opt, torch.optim.SGD(self.parameters(), lr=1e-2)
        if self.hparams.scheduler:
            scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        return opt


def data(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def trainer(strategy, **kw):
    kw = {
        "max_epochs": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **kw,
    }
    return L.Trainer(accelerator="cpu", devices=2, strategy=strategy, **kw)


def report(t, **extra):
    engine = t.strategy.model
    out = {
        "rank": t.global_rank,
        "loss": float(t.callback_metrics.get("loss", float("nan"))),
        "strategy": type(t.strategy).__name__,
        "device": str(getattr(engine, "device", "")),
        **extra,
    }
    if hasattr(engine, "zero_optimization_stage"):
        out["stage"] = engine.zero_optimization_stage()
    with open(os.path.join(WORK, f"rank{t.global_rank}.json"), "w") as f:
        json.dump(out, f)


WORK = "."


def folder(scenario: str) -> str:
    return scenario.replace(":", "_")


def main():
    global WORK
    scenarios, root = sys.argv[1].split(","), sys.argv[2]
    alone = len(scenarios) == 1
    for scenario in scenarios:
        WORK = root if alone else os.path.join(root, folder(scenario))
        os.makedirs(WORK, exist_ok=True)
        try:
            run_scenario(scenario, WORK)
        except Exception:
            if alone:
                raise
            rank = int(os.environ.get("LOCAL_RANK", "0"))
            with open(os.path.join(WORK, f"rank{rank}.error"), "w") as f:
                f.write(traceback.format_exc())
        finally:
            os.environ.pop("PL_DEEPSPEED_CONFIG_PATH", None)


def run_scenario(scenario, work):
    torch.manual_seed(0)
    cfg = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8}
    if scenario.startswith("stage:") or scenario == "by_name":
        strategy = (
            "deepspeed_autotune"
            if scenario == "by_name"
            else AutotuneDeepSpeedStrategy(stage=int(scenario.split(":")[1]))
        )
        t = trainer(strategy, max_epochs=3)
        t.fit(Regressor(), data())
        report(t)
    elif scenario == "offload_optimizer":
        t = trainer(AutotuneDeepSpeedStrategy(stage=2, offload_optimizer=True))
        t.fit(Regressor(cpu_adam=True), data())
        report(t, offload=t.strategy.config["zero_optimization"]["offload_optimizer"]["device"])
    elif scenario == "offload_parameters":
        t = trainer(AutotuneDeepSpeedStrategy(stage=3, offload_optimizer=True, offload_parameters=True))
        t.fit(Regressor(cpu_adam=True), data())
        report(t, offload=t.strategy.config["zero_optimization"]["offload_param"]["device"])
    elif scenario in ("config_dict", "config_path", "config_env"):
        # Both ranks write the same file: atomically, or one rank can read it while the other
        # has just truncated it (a JSONDecodeError on one rank only, after which the ranks'
        # collectives no longer match and every later scenario fails).
        path = os.path.join(work, "ds.json")
        rank_copy = f"{path}.rank{os.environ.get('LOCAL_RANK', '0')}"
        with open(rank_copy, "w") as f:
            json.dump({**cfg, "zero_optimization": {"stage": 1}}, f)
        os.replace(rank_copy, path)
        if scenario == "config_dict":
            strategy = AutotuneDeepSpeedStrategy(config={**cfg, "zero_optimization": {"stage": 1}})
        elif scenario == "config_path":
            strategy = AutotuneDeepSpeedStrategy(config=path)
        else:
            os.environ["PL_DEEPSPEED_CONFIG_PATH"] = path
            strategy = AutotuneDeepSpeedStrategy()
        t = trainer(strategy)
        t.fit(Regressor(), data())
        report(t)
    elif scenario.startswith("precision:"):
        t = trainer(AutotuneDeepSpeedStrategy(stage=2), precision=scenario.split(":", 1)[1])
        t.fit(Regressor(), data())
        report(t, dtype=str(next(t.strategy.model.module.parameters()).dtype))
    elif scenario.startswith("clip:"):
        t = trainer(
            AutotuneDeepSpeedStrategy(stage=2), gradient_clip_val=0.5, gradient_clip_algorithm=scenario.split(":", 1)[1]
        )
        t.fit(Regressor(), data())
        report(t, clipping=t.strategy.config.get("gradient_clipping"))
    elif scenario == "checkpoint":
        ckpt = os.path.join(work, "ckpt")
        t = trainer(AutotuneDeepSpeedStrategy(stage=3), max_epochs=1)
        t.fit(Regressor(scheduler=True), data())
        t.save_checkpoint(ckpt)
        first = float(t.callback_metrics["loss"])
        t2 = trainer(AutotuneDeepSpeedStrategy(stage=3), max_epochs=2)
        t2.fit(Regressor(scheduler=True), data(), ckpt_path=ckpt)
        lr = t2.optimizers[0].param_groups[0]["lr"]
        if t2.global_rank == 0:
            from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

            single = os.path.join(work, "model.pt")
            convert_zero_checkpoint_to_fp32_state_dict(ckpt, single)
            loaded = Regressor.load_from_checkpoint(single)
            n = sum(p.numel() for p in loaded.parameters())
        else:
            n = None
        report(t2, first_loss=first, epoch=t2.current_epoch, global_step=t2.global_step, lr=lr, consolidated=n)
    elif scenario == "sharded_init":
        # Threshold 0: even these small parameters are partitioned instead of kept whole on every rank.
        t = trainer(
            AutotuneDeepSpeedStrategy(
                config={
                    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
                    "train_micro_batch_size_per_gpu": 8,
                }
            )
        )
        model = Regressor(sharded=True)
        t.fit(model, data())
        report(t, built_sharded=model.built_sharded, ds_numel=model.shard[0], local_numel=model.shard[1])
    elif scenario == "validate_predict":
        t = trainer(AutotuneDeepSpeedStrategy(stage=2), max_epochs=1)
        model = Regressor()
        t.fit(model, data(), data(64))
        val = t.validate(model, data(64))
        preds = t.predict(model, data(64))
        report(t, val_loss=val[0]["val_loss"], predictions=sum(p.shape[0] for p in preds))
    elif scenario == "two_optimizers":
        t = trainer(AutotuneDeepSpeedStrategy(stage=2))
        t.fit(Regressor(two_optimizers=True), data())
    else:
        sys.exit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
