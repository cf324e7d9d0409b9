"""Comparing measured configurations honestly: by metric direction and measured noise."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._settings import MEASURE_DEFAULTS
from ._step_stats import Figure, faster_bound, within_noise_of
from ._trial import TrialResult, TrialState

MAXIMIZE = {"throughput": True, "flops": True, "latency": False}
HEADROOM_MATTERS = 0.75
"""Headroom is weighed only where the fastest config's peak is at least this share of the memory
budget (see headroom_matters): below it, the fastest already leaves a quarter of the memory free,
and more buys the user nothing worth up to the tie margin of their training speed. (On CPU, with
peaks of about 1 GiB against a 12 GiB budget, the rule picked micro-batch 8 whenever it tied
with a micro-batch 16 that fresh processes measured 1-2% faster: headroom no run could use.)"""


def better(metric: str, a: float, b: float) -> bool:
    return a > b if MAXIMIZE[metric] else a < b


def figure_of(r: TrialResult, metric: str) -> Figure | None:
    """``r``'s ``metric`` as comparisons read it (see step_stats.Figure); None where unmeasured."""
    v, m = r.metric(metric), r.measurement
    if v is None or m is None:
        return None
    se, df = m.standard_error
    return Figure(v, r.metric_ci(metric) or 0.0, se / m.step_time_mean, df)


def within_noise(metric: str, a: TrialResult, b: TrialResult) -> bool:
    """True when the difference of ``a`` and ``b`` is inside the 95% interval of the difference."""
    fa, fb = figure_of(a, metric), figure_of(b, metric)
    return fa is not None and fb is not None and within_noise_of(fa, fb)


def clearly_worse(metric: str, a: TrialResult, than: TrialResult, margin: float = 0.0) -> bool:
    """``a`` is worse than ``than`` beyond noise (and beyond ``margin``, a fraction)."""
    va, vb = a.metric(metric), than.metric(metric)
    if va is None or vb is None:
        return va is None and vb is not None
    if tied_with(metric, a, than):
        return False
    return better(metric, vb * (1 - margin if MAXIMIZE[metric] else 1 + margin), va)


def shown_worse(metric: str, a: TrialResult, than: TrialResult) -> bool:
    """``a`` stopped measuring early, shown by its probe (one-sided, at 95%) unable to beat a
    figure ``than`` matches or betters: the noise question is answered, and ``a``'s few steps
    give it an interval too wide to ask it again."""
    m, vb = a.measurement, than.metric(metric)
    if m is None or not m.early_stop or m.lost_to is None or m.lost_to_metric != metric or vb is None:
        return False
    return vb == m.lost_to or better(metric, vb, m.lost_to)


def most_faster(c: TrialResult, than: TrialResult, metric: str) -> float:
    """How much faster, as a fraction, ``c`` can be than ``than`` at 95% confidence (see
    step_stats.faster_bound). The question asked is one-sided (can ``c`` be faster by more than
    a margin?), so the one-sided quantile is the right one, and with few steps it is far smaller
    than the two-sided one. Infinite where either measurement has no interval (one timed step)."""
    fc, fb = figure_of(c, metric), figure_of(than, metric)
    assert fc is not None and fb is not None, "compared only measured trials"
    return faster_bound(fc, fb, maximize=MAXIMIZE[metric])


def tied_with(metric: str, r: TrialResult, other: TrialResult) -> bool:
    """``r`` is within noise of ``other`` and not shown worse than it by its probe."""
    return not shown_worse(metric, r, other) and within_noise(metric, r, other)


def headroom_costs_little(metric: str, r: TrialResult, top: TrialResult, margin: float) -> bool:
    """``r`` may be chosen over the faster ``top`` for its memory headroom: tied with it, and
    ``top`` shown (one-sided, at 95%) to be at most ``margin`` faster (MeasureSettings.tie_margin). A 2% gap measured on a
    few noisy steps may hide a 5% one: there the fastest wins."""
    return tied_with(metric, r, top) and most_faster(top, r, metric) <= margin


def headroom_matters(top: TrialResult) -> bool:
    """Whether memory headroom may be weighed against ``top``'s speed: its peak is near the
    budget (at least HEADROOM_MATTERS of it), where a longer run's fragmentation, an evaluation
    step or a longer batch may take what the trial left free. Where the peak or the budget is
    unknown, it may (the cautious answer)."""
    peak, budget = top.max_peak, top.budget
    return not peak or not budget or peak >= HEADROOM_MATTERS * budget


@dataclass
class Choice:
    best: TrialResult
    ties: list[TrialResult]
    """Other trials within noise of the fastest one."""
    note: str


def choose_best(results: list[TrialResult], metric: str, margin: float = MEASURE_DEFAULTS.tie_margin) -> Choice | None:
    """The best OK trial. Among trials within noise of the top one, the one with the most
    memory headroom (lowest peak) wins where its cost is shown within ``margin``
    (headroom_costs_little)
    and the top one's peak is near the budget (headroom_matters), and the note says so. A trial
    shown worse by its probe (see shown_worse) is not tied with one at least as good as what it
    lost to."""
    ok = [r for r in results if r.state is TrialState.OK and r.metric(metric) is not None]
    if not ok:
        return None
    ok.sort(key=lambda r: r.metric(metric), reverse=MAXIMIZE[metric])
    top = ok[0]
    weighed = headroom_matters(top)
    tied = [r for r in ok if r is top or (weighed and headroom_costs_little(metric, r, top, margin))]
    best = min(tied, key=lambda r: (r.max_peak or 0, ok.index(r)))
    ties = [r for r in ok if r is not best and tied_with(metric, r, best)]
    note = ""
    if best is not top:
        note = (
            f"{best.name} is within noise of the fastest, {top.name} ({fmt_metric(metric, top)} vs "
            f"{fmt_metric(metric, best)}), and shown at most {margin:.0%} slower; chose {best.name} "
            "for its memory headroom"
        )
    elif ties:
        note = (
            f"{len(ties)} other trial(s) within noise of {best.name}: "
            + ", ".join(r.name for r in ties)
            + "; the choice between them is not certain"
        )
        leaner = [r for r in ties if (r.max_peak or 0) < (best.max_peak or 0)]
        lean = min(leaner, key=lambda r: r.max_peak or 0) if leaner else None
        if lean is not None and not weighed:
            share = (best.max_peak or 0) / (best.budget or 1)
            note += (
                f"; {lean.name} has more memory headroom, but {best.name}'s peak is {share:.0%} of the memory "
                f"budget, below the {HEADROOM_MATTERS:.0%} where headroom is weighed, so the fastest stands"
            )
        elif lean is not None:
            bound = most_faster(best, lean, metric)
            cost = (
                f"it may be up to {bound:.1%} slower (95%)"
                if math.isfinite(bound)
                else "its cost is unknown (a measurement of one timed step has no interval)"
            )
            note += (
                f"; {lean.name} has more memory headroom, but {cost}, more than the {margin:.0%} "
                "headroom may cost, so the fastest stands"
            )
    return Choice(best, ties, note)


UNITS = {"throughput": "samples/s", "latency": "ms/step", "flops": "TFLOP/s"}


def fmt_number(metric: str, v: float) -> str:
    """A figure of ``metric`` in the unit UNITS names (latency in ms, FLOP/s in TFLOP/s), without it."""
    if metric == "latency":
        return f"{v * 1000:.1f}"
    if metric == "flops":
        return f"{v / 1e12:.3f}"
    return f"{v:.1f}"


def fmt_value(metric: str, r: TrialResult) -> str:
    """The metric with its 95% half-width, without the unit (see UNITS; for table columns)."""
    v, ci = r.metric(metric), r.metric_ci(metric)
    if v is None:
        return "-"
    return f"{fmt_number(metric, v)} ± {fmt_number(metric, ci or 0)}"


def fmt_metric(metric: str, r: TrialResult) -> str:
    """The metric with its 95% half-width and unit."""
    value = fmt_value(metric, r)
    return value if value == "-" else f"{value} {UNITS[metric]}"
