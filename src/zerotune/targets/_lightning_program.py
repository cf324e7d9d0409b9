"""A Lightning program as a tuning target: what its Trainer asks for, found by running the
script up to ``trainer.fit`` once (no training), and the config form Lightning accepts.

Lightning itself is imported only inside the script's process (``zerotune.probe``), never here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError, LaunchError
from ._base import Target
from ._command import UserCommand

BATCH_KEYS = ("gradient_accumulation_steps", "train_batch_size", "train_micro_batch_size_per_gpu")
INSPECT = "inspect.json"


@dataclass(kw_only=True)
class LightningJob:
    """What the script's ``Trainer.fit`` call asks for (reported by the script's own process)."""

    strategy: str
    """Class name of the Trainer's strategy."""
    deepspeed: bool
    """Whether that strategy is (a subclass of) Lightning's DeepSpeedStrategy."""
    world_size: int
    num_nodes: int = 1
    precision: str = "32-true"
    batch_size: int | None = None
    """The micro-batch the script uses now: its ``batch_size`` attribute, else its DataLoader's."""
    batch_size_attr: str | None = None
    """Where the ``batch_size`` attribute lives (model, hparams, datamodule), or None if none does:
    then the micro-batch cannot be changed and stays ``batch_size``."""
    accumulate_grad_batches: int = 1
    base_config: dict[str, Any] = field(default_factory=dict)
    """The strategy's DeepSpeed config as it stands before Lightning fills in batch sizes."""
    stages: list[int] | None = None
    """Stages to search as the strategy asks (AutotuneDeepSpeedStrategy); None: all, unless the
    config lists some or has an autotuning section."""
    autotuning: dict[str, Any] = field(default_factory=dict)
    """Autotuning keys the strategy sets (metric, max_train_batch_size, tuner_num_trials)."""
    offload: bool | None = None
    """Offload to CPU: None where needed (nothing fits without), True also searched, False never."""
    num_params: int | None = None
    """The model's parameter count, known before any trial: stages whose model states alone
    exceed the memory budget are pruned without a launch."""
    fingerprint: str | None = None
    cache_dir: str | None = None
    """AutotuneDeepSpeedStrategy's cache, where a tuning's result is found by later runs."""

    @property
    def global_batch(self) -> int | None:
        if self.batch_size is None:
            return None
        return self.batch_size * self.accumulate_grad_batches * self.world_size

    def tuning_config(self) -> dict[str, Any]:
        """The ds_config to tune from: the strategy's config with the batch keys left to the
        search, at the global batch the script trains with now (unless the user fixed one)."""
        cfg = copy.deepcopy(self.base_config)
        section = dict(cfg.pop("autotuning", None) or {})
        section.update(self.autotuning)
        for key in BATCH_KEYS:
            cfg.pop(key, None)
        zero = dict(cfg.get("zero_optimization") or {})
        if self.stages is not None:
            zero["stage"] = list(self.stages)
        elif "autotuning" not in self.base_config and not isinstance(zero.get("stage"), list):
            # Lightning fills in stage 2 when the user named none ("deepspeed"): search them all.
            zero["stage"] = "all"
        cfg["zero_optimization"] = zero
        if self.batch_size_attr is None:
            cfg["train_micro_batch_size_per_gpu"] = self.batch_size or 1
        if "max_train_batch_size" not in section and self.global_batch is not None:
            section["max_train_batch_size"] = self.global_batch
        cfg["autotuning"] = section
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LightningJob:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class LightningTarget(Target):
    """A Lightning program: the config reaches its DeepSpeedStrategy through the probe's hooks
    (trials) or PL_DEEPSPEED_CONFIG_PATH (the final command), never a --deepspeed_config argument;
    the Trainer starts its own processes."""

    command: UserCommand
    job: LightningJob

    def config_source(self, given):
        source = super().config_source(given)
        return self.job.tuning_config() if source is None else source

    def processes(self, num_gpus: int | None) -> int:
        job = self.job
        if job.num_nodes != 1:
            raise ConfigError(
                f"the Trainer asks for num_nodes={job.num_nodes}; zerotune tunes on one node: tune "
                "with num_nodes=1, then train on more nodes with the config it writes"
            )
        if num_gpus is not None and num_gpus != job.world_size:
            raise ConfigError(
                f"--num-gpus {num_gpus} does not match the Trainer's devices={job.world_size}; "
                f"pass --num-gpus {job.world_size} (or leave it out) or change the Trainer"
            )
        return job.world_size

    @property
    def num_params(self) -> int | None:
        return self.job.num_params

    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        return self.command.trial_args(None, mapped)

    def probe_fields(self, config: Path) -> dict[str, Any]:
        return {"lightning_config": str(config.resolve())}

    def final_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return lightning_form(config)

    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster) -> str:
        """A Lightning script reads the config from PL_DEEPSPEED_CONFIG_PATH and starts its own processes."""
        import shlex

        words = ["python", self.script, *self.trial_args(optimal, mapped)]
        line = (
            " ".join(
                cluster.env_words()
                + [f"PL_DEEPSPEED_CONFIG_PATH={shlex.quote(str(optimal.resolve()))}"]
                + [shlex.quote(w) for w in words]
            )
            + "\n"
        )
        if self.job.strategy == "AutotuneDeepSpeedStrategy":
            return line
        mb, gas = trainer_settings(config, self.job.world_size)
        return (
            f"# {self.job.strategy} takes the stage and ZeRO settings from this config, but not the batch: set "
            f"batch_size={mb} and Trainer(accumulate_grad_batches={gas}) in the script, or use "
            'strategy="deepspeed_autotune" (zerotune.lightning), which sets both from the config.\n' + line
        )

    def own_spec(self, request, dp: int):
        """What the program trains with untuned: its strategy's stage (Lightning's default 2),
        its batch_size and accumulate_grad_batches."""
        from ..trials import TrialSpec

        stage = (self.job.base_config.get("zero_optimization") or {}).get("stage", 2)
        mb, gas = self.job.batch_size, self.job.accumulate_grad_batches
        if not isinstance(stage, int) or isinstance(stage, bool) or not mb:
            return None
        return TrialSpec(stage=stage, micro_batch=mb, grad_accum=gas)

    def after_tuning(self, result) -> None:
        write_cache(self.job, result)


def lightning_form(config: dict[str, Any]) -> dict[str, Any]:
    """A tuned config that Lightning's DeepSpeedStrategy accepts: no gradient_accumulation_steps
    (the Trainer's accumulate_grad_batches sets it); train_batch_size stays, so DeepSpeed checks
    that micro-batch x accumulation x processes still gives the tuned global batch."""
    return {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}


def is_tuned_config(config: dict[str, Any]) -> bool:
    """A config that fixes everything zerotune tunes (stage, micro-batch, global batch), such as
    the ds_config_optimal.json it writes: train with it, nothing to tune."""
    stage = (config.get("zero_optimization") or {}).get("stage")
    return all(
        isinstance(v, int) and not isinstance(v, bool)
        for v in (stage, config.get("train_micro_batch_size_per_gpu"), config.get("train_batch_size"))
    )


def trainer_settings(config: dict[str, Any], world_size: int) -> tuple[int, int]:
    """(batch_size, accumulate_grad_batches) that a tuned config asks of a Lightning program."""
    mb = int(config["train_micro_batch_size_per_gpu"])
    if "gradient_accumulation_steps" in config:
        return mb, int(config["gradient_accumulation_steps"])
    tbs = config.get("train_batch_size")
    if tbs is None:
        return mb, 1
    if tbs % (mb * world_size):
        raise ConfigError(
            f"train_batch_size {tbs} is not micro-batch {mb} x accumulation x {world_size} processes; "
            "use the ds_config_optimal.json that zerotune wrote for this number of devices"
        )
    return mb, tbs // (mb * world_size)


def looks_like_lightning(script: str) -> bool:
    try:
        text = Path(script).read_text(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"^\s*(import|from)\s+(lightning|pytorch_lightning)\b", text, re.M))


def inspect_script(
    script: str, args: list[str], out_dir: Path, env: dict[str, str], timeout: float = 300.0
) -> LightningJob:
    """Run the script in one process until its ``trainer.fit`` call and read what it asks for."""
    from .._files import write_json
    from ..results import claim

    claim(out_dir.parent)  # the results folder: written only where it is zerotune's
    out_dir.mkdir(parents=True, exist_ok=True)
    result = out_dir / INSPECT
    result.unlink(missing_ok=True)
    spec = {
        "mode": "inspect",
        "script": script,
        "args": args,
        "out_dir": str(out_dir.resolve()),
        "local_rank_arg": False,
    }
    write_json(out_dir / "probe.json", spec)
    env = {**env, "ZEROTUNE_PROBE": str((out_dir / "probe.json").resolve())}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK"):  # one plain process, not a rank of a job
        env.pop(key, None)
    log = out_dir / "inspect.log"
    try:
        with open(log, "wb") as f:
            proc = subprocess.run(
                [sys.executable, "-u", "-m", "zerotune.probe"],
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            )
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{script} did not reach trainer.fit within {timeout:.0f} s; see {log}") from None
    if not result.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise LaunchError(
            f"{script} ended (status {proc.returncode}) without calling trainer.fit, so zerotune "
            "found nothing to tune; give a Lightning script that calls trainer.fit, or a DeepSpeed "
            "script with --deepspeed_config ds.json. Its last output:\n  " + "\n  ".join(tail)
        )
    job = LightningJob.from_dict(json.loads(result.read_text()))
    if not job.deepspeed:
        raise ConfigError(
            f"{script} trains with Lightning's {job.strategy}, not DeepSpeed; use "
            'Trainer(strategy="deepspeed_autotune") (after import zerotune.lightning) or '
            'strategy="deepspeed" so that zerotune can tune it'
        )
    return job


# -- the cache of tuned configs (AutotuneDeepSpeedStrategy) -----------------------------------
CACHE_FILE = "tuned.json"


def default_cache_dir() -> Path:
    """$ZEROTUNE_CACHE_DIR, else $XDG_CACHE_HOME/zerotune/lightning (~/.cache/zerotune/lightning):
    results depend on this machine's hardware, so they are kept per user and machine."""
    if os.environ.get("ZEROTUNE_CACHE_DIR"):
        return Path(os.environ["ZEROTUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zerotune" / "lightning"


def cache_entry(cache_dir: str | Path, fingerprint: str) -> Path:
    return Path(cache_dir) / fingerprint / CACHE_FILE


def write_cache(job: LightningJob, result) -> Path | None:
    """Record a tuning's best config where AutotuneDeepSpeedStrategy looks for it (also when the
    CLI tuned the script, so that a later torchrun or SLURM run finds it)."""
    from .._files import write_json

    if not job.fingerprint or not job.cache_dir or result.best_config is None:
        return None
    path = cache_entry(job.cache_dir, job.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    mb, gas = trainer_settings(result.best_config, job.world_size)
    write_json(
        path,
        {
            "fingerprint": job.fingerprint,
            "best": result.best.name,
            "metric": result.metric,
            "value": result.best.metric(result.metric),
            "batch_size": mb,
            "accumulate_grad_batches": gas,
            "config": result.best_config,
            "results_dir": str(Path(result.results_dir).resolve()),
        },
    )
    return path


def read_cache(cache_dir: str | Path, fingerprint: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(cache_entry(cache_dir, fingerprint).read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("config"), dict) else None
