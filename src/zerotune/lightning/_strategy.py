"""Lightning's DeepSpeedStrategy, reused as it is, plus what it lacks: training on CPU.

Lightning's strategy refuses any accelerator but CUDA, requires device indices equal to local
ranks, and hands DeepSpeed ``device_rank=None`` on CPU. Three small overrides lift exactly those
checks; everything else (configs, precision, checkpoints, ZeRO-3 sharded init) is Lightning's.
"""
from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy


class AutotuneDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeed through Lightning, on CUDA or on CPU (DeepSpeed's CPU accelerator, gloo)."""

    strategy_name = "deepspeed_autotune"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)

    # -- CPU support ---------------------------------------------------------------------------
    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        # Lightning gives every CPU rank torch.device("cpu"), index None; DeepSpeed wants the
        # local rank as device_rank, and "cpu:<i>" is the same memory as "cpu" in torch.
        if devices and all(d.type == "cpu" for d in devices):
            devices = [torch.device("cpu", i) for i in range(len(devices))]
        self._parallel_devices = devices

    def setup_environment(self) -> None:
        if isinstance(self.accelerator, CPUAccelerator):
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            DDPStrategy.setup_environment(self)  # skip only the "CUDA GPUs only" refusal
            return
        super().setup_environment()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="DeepSpeed that also runs on CPU (zerotune)")
