"""Lightning's DeepSpeedStrategy, reused as it is, plus what it lacks: tuning on first fit, and
training on CPU.

Tuning: before Lightning starts the other ranks, the first ``fit`` looks up a tuned config for
this model and setup in the cache; without one it runs zerotune's trials of this same program
(each re-runs the script, as Lightning's own launcher does), caches the best, then trains with it.

CPU: Lightning's strategy refuses any accelerator but CUDA, requires device indices equal to local
ranks, and hands DeepSpeed ``device_rank=None`` on CPU. Three small overrides lift exactly those
checks; everything else (configs, precision, checkpoints, ZeRO-3 sharded init) is Lightning's.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .._api_check import checked
from .._errors import ConfigError
from ..request import STAGES, parse_engines, parse_stages
from ..targets import is_tuned_config
from ._tuning import TuneFirstLauncher, Tuning


class AutotuneDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeed through Lightning that finds its own fastest configuration, on CUDA or on CPU.

    Call order: construct (every option checked at once), then ``Trainer(strategy=...).fit``:
    the first fit of a model and setup not yet in the cache tunes (in processes of its own,
    re-running this program per trial), caches the choice, and trains with it; later fits train
    from the cache. After ``fit``, ``strategy.tuning_result`` is the
    :class:`zerotune.TuningResult` (None when not tuned) and ``strategy.tuned_config`` the config
    trained with.

    Args:
        *args: DeepSpeedStrategy's positional arguments.
        autotune: Tune on the first ``fit`` (default True; env ``ZEROTUNE_AUTOTUNE=0`` turns it off).
        stages: ZeRO stages to search (default: all, or the ``stage`` / config's stage if given).
        offload: Offload to CPU (optimizer; for stage 3 also parameters): None (default) where
            needed, when nothing fits without it; True: searched as well; False: never.
        metric: "throughput" (default), "latency" or "flops".
        global_batch: Samples per optimizer step to keep fixed (default: the script's
            ``batch_size`` x ``accumulate_grad_batches`` x processes).
        time_budget: Seconds (or "20m") after which no trial starts, as the Python API's.
        max_trials: Trials launched at most (``tuner_num_trials``).
        memory_per_device: The memory budget per process, as the Python API's.
        trial_timeout: End a trial after this many seconds in all. This and the next eight are
            the measurement policy (:class:`zerotune.trials.MeasureSettings`), None its default.
        stall_timeout: End a trial with no step on any rank for this many seconds.
        precision: Stop measuring once the 95% interval of the step time is within this fraction.
        max_measure_seconds: Measure a trial for at most this many seconds of timed steps.
        remeasure_seconds: The window of each re-measurement of the configurations within noise.
        remeasure_rounds: Rounds of re-measurement at most.
        max_steps: Timed steps a trial takes at most.
        max_warmup_steps: Steps warm-up takes at most.
        tie_margin: How much speed memory headroom may cost in the choice.
        cache_dir: Where results are kept (default ``$ZEROTUNE_CACHE_DIR``, else
            ``~/.cache/zerotune/lightning``).
        retune: Tune again even when a result is cached.
        engines: The engines to choose across, as the Python API's: ``("deepspeed",)`` only. FSDP2
            under Lightning (``ModelParallelStrategy``) shards the model in the LightningModule's own
            ``configure_model``, where zerotune cannot switch it from outside; a Hugging Face
            Trainer or Accelerate script is tuned across both engines.
        **kwargs: DeepSpeedStrategy's keyword arguments (``config``, ``stage``, ``offload_optimizer``, ...).
    """

    strategy_name = "deepspeed_autotune"

    @checked
    def __init__(
        self,
        *args: Any,
        autotune: bool = True,
        stages: Sequence[int] | None = None,
        offload: bool | None = None,
        metric: str = "throughput",
        global_batch: int | None = None,
        time_budget: float | str | None = None,
        max_trials: int | None = None,
        memory_per_device: int | str | None = None,
        trial_timeout: float | None = None,
        stall_timeout: float | None = None,
        precision: float | None = None,
        max_measure_seconds: float | None = None,
        remeasure_seconds: float | None = None,
        remeasure_rounds: int | None = None,
        max_steps: int | None = None,
        max_warmup_steps: int | None = None,
        tie_margin: float | None = None,
        cache_dir: str | Path | None = None,
        retune: bool = False,
        engines: str | Sequence[str] = ("deepspeed",),
        **kwargs: Any,
    ):
        if parse_engines(engines) != ("deepspeed",):
            raise ConfigError(
                "deepspeed_autotune(engines=...): Lightning's FSDP2 (ModelParallelStrategy) shards the model in "
                "the LightningModule's configure_model, which zerotune cannot switch from outside; tune it with "
                "engines=('deepspeed',), or tune a Hugging Face Trainer or Accelerate script across both engines"
            )
        user_config = kwargs.get("config") is not None or (self.DEEPSPEED_ENV_VAR in os.environ)
        super().__init__(*args, **kwargs)
        if stages is None and "stage" in kwargs and not user_config:
            stages = [kwargs["stage"]]
        self.tuning = Tuning(
            autotune=autotune,
            stages=stages,
            offload=offload,
            metric=metric,
            global_batch=global_batch,
            time_budget=time_budget,
            max_trials=max_trials,
            memory_per_device=memory_per_device,
            measure={
                name: value
                for name, value in (
                    ("trial_timeout", trial_timeout),
                    ("stall_timeout", stall_timeout),
                    ("precision", precision),
                    ("max_measure_seconds", max_measure_seconds),
                    ("remeasure_seconds", remeasure_seconds),
                    ("remeasure_rounds", remeasure_rounds),
                    ("max_steps", max_steps),
                    ("max_warmup_steps", max_warmup_steps),
                    ("tie_margin", tie_margin),
                )
                if value is not None
            },
            cache_dir=cache_dir,
            retune=retune,
            user_config=user_config,
        )
        if user_config and is_tuned_config(self.config):  # e.g. zerotune's ds_config_optimal.json
            self.tuning.entry = {"best": "the given config", "config": copy.deepcopy(self.config)}

    @property
    def tuning_result(self):
        return self.tuning.result

    @property
    def tuned_config(self) -> dict[str, Any] | None:
        return self.tuning.entry["config"] if self.tuning.entry else None

    # -- tuning --------------------------------------------------------------------------------
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._launcher is not None:  # Lightning starts the ranks: tune before it does
            self._launcher = TuneFirstLauncher(self, self._launcher)

    def _describe_extras(self, job, model) -> None:
        """Called while describing a fit: this strategy's search space, cache and fingerprint."""
        from ..targets import fingerprint

        stages = self.tuning.stages
        if stages is None and self.tuning.user_config:
            stages = parse_stages((job.base_config.get("zero_optimization") or {}).get("stage"))
        job.stages = sorted(set(stages)) if stages is not None else list(STAGES)
        job.autotuning = self.tuning.autotuning_keys()
        job.offload = self.tuning.offload
        job.cache_dir = str(self.tuning.cache_path())
        job.fingerprint = fingerprint(job, model, self)

    def setup_environment(self) -> None:
        if self.tuning.active():
            # Started by torchrun/SLURM, a rank Lightning started after rank 0 tuned, or not fitting:
            # only the cache. Every rank decides alike, so none waits for another in a collective.
            model = self.lightning_module
            trainer = model.trainer
            self.tuning.resolve(
                self,
                trainer,
                model,
                trainer.datamodule,
                None,
                can_tune=False,
                required=trainer.state.fn == TrainerFn.FITTING,
            )
        if isinstance(self.accelerator, CPUAccelerator):
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            DDPStrategy.setup_environment(self)  # skip only the "CUDA GPUs only" refusal
            return
        super().setup_environment()

    def setup(self, trainer) -> None:
        if self.tuning.entry is not None and not self.tuning.in_trial():
            from ..targets import apply_tuned

            mb, gas = apply_tuned(self, trainer, self.tuning.entry["config"])
            rank_zero_info(
                f"zerotune: training with {self.tuning.entry['best']} (batch_size={mb}, accumulate_grad_batches={gas})"
            )
        super().setup(trainer)

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

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="DeepSpeed that tunes itself and also runs on CPU (zerotune)"
        )
