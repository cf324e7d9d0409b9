"""The choice against the user's own configuration: what tuning gained them.

The user's config runs as the tuning's first trial (see request._own). The choice is compared
with it on the figures the choice was made on: where both were measured again side by side
(the confirmation interleaves the user's config whenever it is within noise of the pick), those;
else each trial's own. The speed-up carries a 95% interval (the ratio's, from both figures'
relative standard errors and Welch's degrees of freedom), and the tuning pays itself back after
the training steps whose time saved adds up to what the tuning took.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..trials import MAXIMIZE, TrialResult, TrialSpec, TrialState, figure_of, fmt_metric, t95_df, tied_with
from ..units import format_duration, format_size


@dataclass(kw_only=True)
class OwnConfig:
    name: str
    """The trial of the user's own configuration."""
    state: str
    figure: str = ""
    """Its figure as the comparison read it (re-measured where ``remeasured``)."""
    peak: int | None = None
    remeasured: bool = False
    """The figures compared are the interleaved re-measurements of both."""
    chosen: bool = False
    fastest: bool = False
    """Within noise of the choice (or the choice itself): already the fastest that was found."""
    speedup: float | None = None
    """The choice's speed over the user's config (throughput, or the inverse of latency)."""
    low: float | None = None
    high: float | None = None
    """The 95% interval of ``speedup``."""
    payback_steps: int | None = None
    """Training steps at the choice after which the time saved adds up to the tuning's cost."""
    payback_seconds: float | None = None
    """The same, as training time at the choice."""
    reason: str = ""
    """Why it did not measure (its state's reason)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The summary's lines on the user's config."""
        head = f"your config: {self.name}"
        if self.state != TrialState.OK.value:
            return [f"{head} ended {self.state}" + (f" ({self.reason})" if self.reason else "")]
        again = " re-measured" if self.remeasured else ""
        head += f"  {self.figure}{again}  peak {format_size(self.peak)}/rank"
        if self.chosen:
            return [head, "your config is the choice: already the fastest the search found"]
        gain = "" if self.speedup is None else f"the choice is {self.speedup:.2f}x as fast"
        if gain and self.low is not None and self.high is not None:
            gain += f" (95%: {self.low:.2f}-{self.high:.2f})"
        if self.fastest:
            return [head, f"your config is already the fastest within noise ({gain or 'the choice ties with it'})"]
        out = [head, gain] if gain else [head]
        if self.payback_steps is not None and self.payback_seconds is not None:
            out.append(
                f"payback: after {self.payback_steps} training steps at the choice "
                f"({format_duration(self.payback_seconds)} of training), the time saved covers the tuning"
            )
        return out


def compare_with_own(
    trials: list[TrialResult],
    best: TrialResult | None,
    own: TrialSpec | None,
    confirmed: dict[str, TrialResult],
    metric: str,
    spent: float,
) -> OwnConfig | None:
    """The user's config (``own``) against the choice ``best``; None where the config names none
    or it was not run. ``confirmed``: the re-measured figures by name; ``spent``: the tuning's
    cost in seconds."""
    mine = next((t for t in trials if own is not None and t.spec == own), None)
    if mine is None:
        return None
    out = OwnConfig(name=mine.name, state=mine.state.value, reason=mine.reason, peak=mine.max_peak)
    if mine.state is not TrialState.OK or mine.measurement is None or best is None or best.measurement is None:
        return out
    again = mine.name in confirmed and best.name in confirmed
    a, b = (confirmed[mine.name], confirmed[best.name]) if again else (mine, best)
    out.figure, out.remeasured, out.chosen = fmt_metric(metric, a), again, mine.name == best.name
    out.fastest = out.chosen or tied_with(metric, a, b)
    fa, fb = figure_of(a, metric), figure_of(b, metric)
    if out.chosen or fa is None or fb is None or not fa.value or not fb.value:
        return out
    out.speedup = fb.value / fa.value if MAXIMIZE[metric] else fa.value / fb.value
    variance = fa.rel_se**2 + fb.rel_se**2
    if math.isfinite(variance) and variance > 0:
        parts = [(fa.rel_se**4 / fa.df if fa.df > 0 else math.inf), (fb.rel_se**4 / fb.df if fb.df > 0 else math.inf)]
        df = variance**2 / sum(parts) if all(math.isfinite(p) for p in parts) and sum(parts) > 0 else math.inf
        spread = t95_df(df) * math.sqrt(variance)
        out.low, out.high = out.speedup * math.exp(-spread), out.speedup * math.exp(spread)
    mine_step, best_step = a.measurement.step_time_mean, b.measurement.step_time_mean
    per_sample_saved = mine_step / a.measurement.samples_per_step - best_step / b.measurement.samples_per_step
    if per_sample_saved > 0 and not out.fastest:
        out.payback_steps = int(spent / (per_sample_saved * b.measurement.samples_per_step)) + 1
        out.payback_seconds = out.payback_steps * best_step
    return out
