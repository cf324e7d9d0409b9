"""Settings that every face (CLI, Python API, Lightning strategy) builds the same way, each
validated once, here: the measurement policy is every constant of how a trial and a
re-measurement are measured, in one object."""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ConfigError
from ..units import positive_seconds


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    """How a trial is measured and when it is given up."""

    precision: float = 0.03
    """Stop measuring once the 95% interval of the mean step time is within this fraction of it."""
    max_measure_seconds: float = 10.0
    """Measure at most this long (then the trial is marked capped, its interval as measured; it
    ends before a step that, at its mean step time so far, would end past it), once it has the
    fewest timed steps a trial may settle on (end_profile_step -
    start_profile_step, at least 3; two where the step is estimated from micro-steps): a slow
    job's trials take those steps however long they are. Longer buys a separate trial little:
    one config's trials minutes apart read 4-7% apart on a shared machine, beyond a 3%
    interval, and the confirmation settles close ones interleaved, which no window can (a
    15 s cap let the bundled example's first trial take 9 noisy steps to ±4.4%; its first 6 gave ±4.1%)."""
    trial_timeout: float = 600.0
    """End a trial after this many seconds in all (start-up included) and record it as timeout."""
    stall_timeout: float = 120.0
    """Once training has started, end a trial with no forward or optimizer step on any rank for
    this long (or 5 x its slowest step, if more): a hang."""
    max_steps: int = 60
    """Timed steps a trial (or a re-measurement) takes at most, whatever its time cap."""
    max_warmup_steps: int = 10
    """Steps warm-up may take at most before timing starts, settled or not (see zerotune.probe, _settled)."""
    remeasure_seconds: float = 5.0
    """A re-measurement's window: the configurations within noise of the best are measured
    again, interleaved, each for about this long (once it has a trial's fewest timed steps; at
    most ``max_measure_seconds``); one whose comparison with the leader more of its steps can still
    settle measures on, up to ``max_measure_seconds`` (see tuning.confirm.settle_target)."""

    @property
    def window_seconds(self) -> float:
        """The re-measurement window as measured: never past the cap of every measurement."""
        return min(self.remeasure_seconds, self.max_measure_seconds)

    remeasure_rounds: int = 2
    """Rounds of re-measurement at most: a second runs only where the first left the choice open."""
    tie_margin: float = 0.03
    """How much speed memory headroom may cost: among configurations within noise of the fastest,
    a leaner one is chosen only where the fastest is shown (one-sided, at 95%) at most this much
    faster; and a re-measurement round settles the choice once no candidate can be more than
    this much faster than the pick. A wide interval makes many configurations statistically
    tied, but trading a possibly 10% slower one for headroom is a bad bet; 0 always keeps the
    fastest."""

    def __post_init__(self) -> None:
        if not isinstance(self.precision, (int, float)) or not 0 < self.precision < 1:
            raise ConfigError(
                f"precision (--precision) {self.precision!r} must be a fraction between 0 and 1, e.g. 0.03"
            )
        margin = self.tie_margin
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin <= 0.5:
            raise ConfigError(f"tie_margin (--tie-margin) {margin!r} must be a fraction from 0 to 0.5, e.g. 0.03")
        for name in ("max_measure_seconds", "trial_timeout", "stall_timeout", "remeasure_seconds"):
            option = "--" + name.replace("_", "-")
            object.__setattr__(self, name, positive_seconds(getattr(self, name), f"{name} ({option})"))
        for name, low, high in (
            ("max_steps", 2, 100_000),
            ("max_warmup_steps", 1, 10_000),
            ("remeasure_rounds", 1, 10),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                option = "--" + name.replace("_", "-")
                raise ConfigError(f"{name} ({option}) {value!r} must be a whole number from {low} to {high}")

    @classmethod
    def of(cls, **given: float | int | None) -> MeasureSettings:
        """Settings from keyword values where None means the default (the faces' optional options)."""
        return cls(**{k: v for k, v in given.items() if v is not None})


MEASURE_DEFAULTS = MeasureSettings()
