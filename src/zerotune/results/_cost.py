"""What a tuning cost, and where the time went.

Every trial's wall time splits into its timed steps (the measurement itself) and the rest:
launch, start-up, warm-up and teardown, the overhead that warm trials and shorter measurement
attack. When the choice pays the cost back is the comparison with the user's own config
(results._own_config).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..trials import TrialResult, TrialState


@dataclass(kw_only=True)
class TuningCost:
    wall_time: float
    """The tuning, end to end (this invocation)."""
    trial_time: float
    """Wall time of every trial of the tuning, including those an earlier run measured."""
    earlier_time: float = 0.0
    """Of ``trial_time``, what the trials and re-measurements this invocation reused from disk
    took in the earlier runs that measured them: part of what the tuning cost, though not of
    ``wall_time`` (a rerun that resumes takes seconds)."""
    measuring: float
    """Of that, the timed steps."""
    overhead: float
    """Of that, everything else: launch, start-up, warm-up, teardown."""
    trials: int
    """Trials that ran (not pruned)."""
    remeasured: int = 0
    """Re-measurements that confirmed the choice (their time is in ``trial_time``)."""
    warm: int = 0
    """Trials that ran in warm processes (launched for an earlier trial)."""
    launches: int = 0
    """Trials that launched processes: cold ones, and the first of each warm group."""
    cold_reasons: list[str] = field(default_factory=list)
    """Why trials ran cold, or why warm processes were retired (each once)."""

    @property
    def total_time(self) -> float:
        """What the tuning cost in all: ``wall_time`` plus ``earlier_time``."""
        return self.wall_time + self.earlier_time

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_time": self.total_time}

    def lines(self) -> list[str]:
        share = f" ({self.overhead / self.trial_time:.0%})" if self.trial_time else ""
        again = f" and {self.remeasured} re-measurement(s)" if self.remeasured else ""
        spent = f"tuning {self.wall_time:.0f} s"
        if self.earlier_time:
            spent = (
                f"tuning {self.total_time:.0f} s in all ({self.wall_time:.0f} s in this run, "
                f"{self.earlier_time:.0f} s in the earlier runs that measured what it reused)"
            )
        out = [
            f"cost: {spent}; {self.trials} trial(s){again} took {self.trial_time:.0f} s, "
            f"{self.measuring:.0f} s of it timed steps and {self.overhead:.0f} s launch, start-up, warm-up and "
            f"teardown{share}"
        ]
        if self.launches or self.warm:
            why = f"; {'; '.join(self.cold_reasons)}" if self.cold_reasons else ""
            out.append(
                f"processes: {self.warm} of {self.warm + self.launches} run(s) were warm, in processes "
                f"an earlier trial launched; {self.launches} launch(es){why}"
            )
        return out


def tuning_cost(
    trials: list[TrialResult],
    wall_time: float,
    remeasured: list[TrialResult] | None = None,
    earlier_time: float = 0.0,
) -> TuningCost:
    """``remeasured``: runs that confirmed the choice, counted in the time (not as trials);
    ``earlier_time``: see TuningCost."""
    ran = [t for t in trials if t.state is not TrialState.PRUNED]
    confirming = list(remeasured or [])
    trial_time = sum(t.wall_time for t in ran + confirming)
    measuring = sum(t.measurement.timed_seconds for t in ran + confirming if t.measurement is not None)
    started = [t for t in ran + confirming if t.start]  # launched by this tuning or a recent one (older: unknown)
    reasons = [t.start.split(": ", 1)[1] for t in started if t.start.startswith("cold: ")]
    reasons += [f"retired after {t.name}: {t.retired}" for t in started if t.retired]
    cost = TuningCost(
        wall_time=wall_time,
        trial_time=trial_time,
        earlier_time=earlier_time,
        measuring=measuring,
        overhead=max(0.0, trial_time - measuring),
        trials=len(ran),
        remeasured=len(confirming),
        warm=sum(t.warm for t in started),
        launches=sum(not t.warm for t in started),
        cold_reasons=list(dict.fromkeys(reasons)),
    )
    return cost
