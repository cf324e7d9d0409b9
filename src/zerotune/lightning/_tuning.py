"""When and how AutotuneDeepSpeedStrategy tunes: cache lookup, trials, and the launcher hook
that runs them before Lightning starts the other ranks."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .._errors import ConfigError, ZerotuneError
from ..targets import LightningJob, LightningTarget, UserCommand, default_cache_dir, read_cache


@dataclass(kw_only=True)
class Tuning:
    """The strategy's tuning options and, once resolved, the config it trains with."""

    autotune: bool = True
    stages: Any = None
    offload: bool | None = None
    metric: str = "throughput"
    global_batch: int | None = None
    time_budget: float | str | None = None
    max_trials: int | None = None
    memory_per_device: int | str | None = None
    measure: dict[str, Any] = field(default_factory=dict)
    """The measurement policy's options given, under the Python API's names (MeasureSettings';
    the others keep their defaults)."""
    cache_dir: str | Path | None = None
    retune: bool = False
    user_config: bool = False
    """The user passed a DeepSpeed config (dict, path or PL_DEEPSPEED_CONFIG_PATH): its stage counts."""
    entry: dict[str, Any] | None = None
    """The cache entry trained with: best trial, batch_size, accumulate_grad_batches, config."""
    result: Any = None

    def __post_init__(self):
        if self.metric not in ("throughput", "latency", "flops"):
            raise ConfigError(f"metric {self.metric!r} is not one of throughput, latency, flops")
        if self.global_batch is not None and self.global_batch < 1:
            raise ConfigError(f"global_batch must be a positive number of samples, not {self.global_batch}")
        from ..trials import MeasureSettings

        self.measure_settings = MeasureSettings.of(**self.measure)  # checked now, not at fit

    @staticmethod
    def in_trial() -> bool:
        """Inside one of zerotune's trials (or its real run), where the probe sets the config."""
        return bool(os.environ.get("ZEROTUNE_PROBE"))

    def active(self) -> bool:
        """Tuning applies: asked for, not switched off, not inside a trial, no tuned config given."""
        off = os.environ.get("ZEROTUNE_AUTOTUNE", "1").lower() in ("0", "false", "no", "off")
        return self.autotune and not off and not self.in_trial() and self.entry is None

    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir()

    def autotuning_keys(self) -> dict[str, Any]:
        keys: dict[str, Any] = {"metric": self.metric}
        if self.global_batch is not None:
            keys["max_train_batch_size"] = self.global_batch
        if self.max_trials is not None:
            keys["tuner_num_trials"] = self.max_trials
        return keys

    def resolve(
        self, strategy, trainer, model, datamodule, train_dataloaders, *, can_tune: bool, required: bool
    ) -> None:
        """Find the config to train with: cached, or (``can_tune``) tuned now. ``required``: a
        miss is an error (fit); otherwise the strategy's own config is used (validate, test)."""
        from ..targets import describe

        job = describe(strategy, trainer, model, datamodule, train_dataloaders)
        entry = None if (self.retune and can_tune) else read_cache(job.cache_dir, job.fingerprint)
        if entry is None and can_tune:
            self._tune(job)
            entry = read_cache(job.cache_dir, job.fingerprint)
        elif entry is not None:
            rank_zero_info(f"zerotune: using the tuned config {entry['best']} from {job.cache_dir}/{job.fingerprint}")
        if entry is None:
            if required:
                raise ConfigError(_not_cached_message(job))
            return
        self.entry = entry
        try:
            from ..results import load_results

            self.result = load_results(entry["results_dir"])
        except (ZerotuneError, OSError, ValueError):
            self.result = None  # the trials' folder was removed; the cached config still holds

    def _tune(self, job: LightningJob) -> None:
        from rich.markup import escape

        from ..cli import ProgressPrinter, print_summary
        from ..launch import ClusterSettings
        from ..tuning import Autotuner, SearchSettings

        if job.batch_size is None:
            raise ConfigError(
                "deepspeed_autotune could not find the batch size to tune: give the LightningModule, "
                "its hparams or the DataModule a batch_size attribute and build the train DataLoader "
                "with it (as Lightning's BatchSizeFinder expects), or pass global_batch=..."
            )
        script = sys.argv[0] if sys.argv else ""
        if not script.endswith(".py") or not Path(script).is_file():
            raise ConfigError(
                "deepspeed_autotune tunes by re-running this program for each trial, which needs it "
                f"to be a .py script (here: {script!r}); run `python train.py`, or tune once with "
                "`zerotune tune train.py` and pass autotune=False here"
            )
        printer = ProgressPrinter()
        printer.console.print(
            f"[bold]zerotune:[/] tuning DeepSpeed for this model on {job.world_size} "
            f"process(es); results go to {escape(f'{job.cache_dir}/{job.fingerprint}')}"
        )
        if job.batch_size_attr is None:
            printer.console.print(
                f"  [dim]micro-batch fixed at the DataLoader's {job.batch_size}: no batch_size "
                "attribute to change it through[/]"
            )
        command = [script, *sys.argv[1:]]
        tuner = Autotuner(
            command,
            ds_config=job.tuning_config(),
            target=LightningTarget(command=UserCommand.parse(command), job=job),
            results_dir=Path(job.cache_dir) / job.fingerprint,
            overwrite=True if self.retune else None,
            cluster=ClusterSettings(
                num_gpus=job.world_size,
                memory_per_device=self.memory_per_device,
                slurm=False,  # Lightning tunes on its own node; its SLURMEnvironment runs the training
            ),
            measure=self.measure_settings,
            search=SearchSettings(time_budget=self.time_budget, offload=job.offload),
            on_event=printer,
        )
        with printer.watch(tuner):
            result = tuner.tune()
        print_summary(result, printer.console)


def _not_cached_message(job: LightningJob) -> str:
    argv = " ".join(sys.argv) if sys.argv else "train.py"
    return (
        f"deepspeed_autotune has no tuned config for this model and setup (fingerprint {job.fingerprint} in "
        f"{job.cache_dir}), and these processes were started outside Lightning (torchrun, SLURM, mpirun), so "
        "it cannot start trial processes of its own. Tune once on one node with "
        f"`zerotune tune --num-gpus {job.world_size // max(1, job.num_nodes)} {argv}` or `python {argv}` "
        "(both fill the cache), then start this job again; or pass autotune=False to train without tuning"
    )


class TuneFirstLauncher(_Launcher):
    """Wraps the launcher Lightning chose: on fit, tune (or read the cache) in this process
    before any other rank starts, so that every rank trains with the same config."""

    def __init__(self, strategy, inner: _Launcher):
        self.strategy, self.inner = strategy, inner

    @property
    def is_interactive_compatible(self) -> bool:
        return self.inner.is_interactive_compatible

    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        tuning = self.strategy.tuning
        # Ranks that torchrun, SLURM or mpirun started (Lightning's children too) read the cache in
        # setup_environment instead: only a process that starts the others may run trials.
        starts_ranks = not self.strategy.cluster_environment.creates_processes_externally
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING and tuning.active() and starts_ranks:
            model, train, _val, datamodule = (list(args) + [None] * 4)[:4]
            if isinstance(train, LightningDataModule):
                datamodule, train = train, None
            tuning.resolve(self.strategy, trainer, model, datamodule, train, can_tune=True, required=True)
        return self.inner.launch(function, *args, trainer=trainer, **kwargs)

    def kill(self, signum) -> None:
        self.inner.kill(signum)
