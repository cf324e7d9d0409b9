"""Hooks on Lightning inside a trial process, so that a Lightning script is tuned unmodified.

inspect: ``Trainer.fit`` reports what it asks for (processes, batch size, precision, the
strategy's config) and ends the process before anything starts.
measure / run: any DeepSpeedStrategy (Lightning's or zerotune's) trains with the trial's config,
its micro-batch and accumulation set the way the Trainer sets them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .._files import write_json


def install_inspect(spec: dict[str, Any]) -> None:
    import lightning.pytorch as pl

    from ..targets import INSPECT, describe

    def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None, *args, **kwargs):
        if isinstance(train_dataloaders, pl.LightningDataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        job = describe(self.strategy, self, model, datamodule, train_dataloaders)
        write_json(Path(spec["out_dir"]) / INSPECT, job.to_dict())
        sys.stdout.flush()
        os._exit(0)

    pl.Trainer.fit = fit


def install_trial(config_path: str, probe=None) -> None:
    """``probe``: the StepProbe of a measured trial (None when training for real)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from ..targets import apply_tuned

    orig_dist, orig_setup = DeepSpeedStrategy.setup_distributed, DeepSpeedStrategy.setup

    def setup_distributed(self) -> None:
        started = int(os.environ.get("WORLD_SIZE", "1"))
        asked = len(self.parallel_devices or [None]) * self.num_nodes
        if asked != started:  # else Lightning would wait forever for processes that never come
            message = (
                f"the Trainer asks for {asked} processes (devices x num_nodes) but zerotune started "
                f"{started}; pass --num-gpus {asked} or change the Trainer's devices"
            )
            if probe is not None:
                probe.finish("crashed", message, code=4)
            sys.exit(f"zerotune: {message}")
        orig_dist(self)

    def setup(self, trainer) -> None:
        config = json.loads(Path(config_path).read_text())
        apply_tuned(self, trainer, config)
        if probe is not None:
            # A trial trains until the probe has measured enough, whatever the script's own limits.
            trainer.fit_loop.max_epochs = -1
            trainer.fit_loop.epoch_loop.max_steps = -1
        orig_setup(self, trainer)

    DeepSpeedStrategy.setup_distributed = setup_distributed
    DeepSpeedStrategy.setup = setup
