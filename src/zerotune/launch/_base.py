"""How a trial's processes start, apart from what is tried (search) and when to stop (tuner)."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..trial import TrialResult, TrialSpec


@dataclass(kw_only=True)
class TrialJob:
    """Everything a launcher needs to run one trial."""

    spec: TrialSpec
    trial_dir: Path
    script: str
    script_args: list[str]
    """The user's arguments with the config path (and arg_mappings) replaced for this trial."""
    local_rank_arg: bool
    num_gpus: int
    budget: int | None
    warmup_steps: int
    min_steps: int
    max_steps: int = 60
    max_seconds: float = 30.0
    rel_ci: float = 0.03
    timeout: float = 600.0
    to_beat: dict[str, Any] | None = None
    """{"metric": "throughput"|"latency", "value": v}: the trial may stop measuring as soon as
    it clearly cannot beat v (the best so far)."""
    env: dict[str, str] = field(default_factory=dict)
    lightning: bool = False
    """A Lightning script: the trial's ds_config.json reaches its DeepSpeedStrategy through the
    probe's Lightning hooks rather than through a --deepspeed_config argument."""


class Launcher(abc.ABC):
    """Runs one trial to completion and classifies how it ended. Must never raise for a trial
    that fails: failures are results (state crashed, oom, timeout)."""

    @abc.abstractmethod
    def run(self, job: TrialJob) -> TrialResult:
        ...

    def close(self) -> None:
        """End anything still running (called on Ctrl-C and at exit)."""
