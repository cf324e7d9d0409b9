"""Statistics of step times: the probe uses them to decide when a trial has measured enough, the
tuner to read, compare and combine its measurements. Free of torch, so both can import it."""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

# Two-sided 95% Student-t quantiles for 1..29 degrees of freedom.
_T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
]

# One-sided 95% quantiles (the 95th percentile) for 1..29 degrees of freedom.
_T95_ONE_SIDED = [
    6.314,
    2.920,
    2.353,
    2.132,
    2.015,
    1.943,
    1.895,
    1.860,
    1.833,
    1.812,
    1.796,
    1.782,
    1.771,
    1.761,
    1.753,
    1.746,
    1.740,
    1.734,
    1.729,
    1.725,
    1.721,
    1.717,
    1.714,
    1.711,
    1.708,
    1.706,
    1.703,
    1.701,
    1.699,
]

# Beyond: 30, 40, 60 and 120 degrees of freedom (rounded up), then the normal's quantile.
_TAIL = {
    False: [(30, 2.043), (40, 2.022), (60, 2.001), (120, 1.980), (math.inf, 1.960)],
    True: [(30, 1.698), (40, 1.685), (60, 1.671), (120, 1.658), (math.inf, 1.645)],
}

# (1/df, quantile) from df = 1 to df = infinity (1/df = 0), for interpolation.
_KNOTS = {
    one_sided: [(1 / (i + 1), t) for i, t in enumerate(_T95_ONE_SIDED if one_sided else _T95)]
    + [(1 / df, t) for df, t in _TAIL[one_sided]]
    for one_sided in (False, True)
}


def t95_df(df: float, *, one_sided: bool = False) -> float:
    """The 95% Student-t quantile for ``df`` degrees of freedom; two-sided unless ``one_sided``.
    Infinite below one degree of freedom. Between the tabulated degrees of freedom (a fraction,
    as Welch-Satterthwaite's are, or beyond 30) it interpolates linearly in 1/df: the quantile
    is convex in 1/df, so the chord lies just above it and the interval stays a 95% one.
    (Rounding down instead took 1.8 degrees of freedom as 1, a quantile of 12.7 for one near 5;
    and every df from 30 as the normal's 1.96, below t's.)"""
    if not df >= 1:
        return math.inf
    x = 1 / df
    knots = _KNOTS[one_sided]
    for (x0, t0), (x1, t1) in zip(knots, knots[1:]):
        if x1 <= x <= x0:
            return t0 if x == x0 else t1 + (t0 - t1) * (x - x1) / (x0 - x1)
    raise AssertionError(f"1/df = {x} outside (0, 1]")  # df >= 1 always lands in a segment


def summarize(intervals: list[float]) -> tuple[float, float, float]:
    """Mean, standard deviation and 95% half-width of the mean of step times."""
    n = len(intervals)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = statistics.fmean(intervals)
    if n == 1:
        return mean, 0.0, math.inf
    std = statistics.stdev(intervals)
    return mean, std, t95_df(n - 1) * std / math.sqrt(n)


DISTURBED = 0.25
"""A timed step (or micro-step) is a disturbance when it is more than this fraction slower than
the median of its measurement's samples, and more than DISTURBED_SPREADS robust standard
deviations (1.4826 x the median absolute deviation) above it."""
DISTURBED_SPREADS = 5.0
DISTURBED_FROM = 6
"""Samples a measurement needs before any is left out: any six steps of a job slower every third
step hold two slow ones, more than the share allows."""
DISTURBED_SHARE = 8
"""At most one sample in this many is left out (one below 2 x DISTURBED_SHARE samples); where
more stand out, they are the job's own pattern and every sample counts."""


class Samples(NamedTuple):
    """A measurement's samples split into those its figure is computed from and the disturbances
    left out (see split_disturbed), with the median the disturbances were judged against."""

    kept: list[float]
    left_out: list[float]
    median: float


def split_disturbed(samples: list[float]) -> Samples:
    """Leave out a rare step far slower than the rest. On a shared machine about one step in 30
    ran 35-47% slower than its neighbours (2.7 s among 1.9 s ones); in a trial of 8 steps one such
    step moves the mean by 5% and widens the 95% interval to about 12%, so the trial runs to its
    time cap, is not stopped early, or ties and is measured again, though what it measured is the
    machine, not the config. A step is left out only when it is both 25% slower than the median
    and five robust spreads above it (a 5-sigma event for steps that vary by 5%, so undisturbed
    steps are not trimmed and the mean of the rest is not biased fast), only when the measurement
    has at least DISTURBED_FROM samples, and at most one in DISTURBED_SHARE: a job whose own step is
    slower every second or third step shows that more often than the share allows (in any six
    steps), so all of its steps count. What is left out is kept in the measurement and shown in the summary."""
    if len(samples) < DISTURBED_FROM:
        return Samples(list(samples), [], statistics.median(samples) if samples else math.nan)
    median = statistics.median(samples)
    spread = 1.4826 * statistics.median(abs(x - median) for x in samples)
    limit = median + max(DISTURBED * median, DISTURBED_SPREADS * spread)
    out = [x for x in samples if x > limit]
    if not out or len(out) > max(1, len(samples) // DISTURBED_SHARE):
        return Samples(list(samples), [], median)
    return Samples([x for x in samples if x <= limit], out, median)


def is_stable(intervals: list[float], *, min_steps: int, rel_ci: float) -> bool:
    """True once at least ``min_steps`` were measured and the 95% interval of the mean is
    within ``rel_ci`` (a fraction) of it."""
    if len(intervals) < max(2, min_steps):
        return False
    mean, _, ci = summarize(intervals)
    return ci <= rel_ci * mean


def welch_df(parts: list[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent means, each given as
    (its variance, its sample count)."""
    num = sum(v for v, _ in parts) ** 2
    den = sum(v * v / (n - 1) for v, n in parts if n > 1 and v > 0)
    return num / den if den > 0 else math.inf


MICRO_STEPS_FROM = 8
"""Gradient accumulation from which a step's time is estimated from its micro-steps. With
independent parts the estimate's variance equals whole steps' ((g-1) plain variances and one
boundary's, over the step count): what it gains is degrees of freedom, large only when g is.
Below, the boundary's few samples keep its degrees of freedom near whole steps', and the timer's
split between the parts adds its jitter to both (their sum's is less): on the bundled example at
g = 4, whole steps reached a 3% interval in 3 steps where micro-steps needed 4 to 6."""


def step_estimate(micro: list[float], boundary: list[float], accumulation: int) -> tuple[float, float, float]:
    """Mean, standard deviation and 95% half-width of one optimizer step's time, estimated from
    its parts: ``accumulation - 1`` plain micro-steps (forward, backward) and one boundary
    micro-step (forward, backward, gradient reduction, optimizer step), timed separately. At
    accumulation 32 one whole step then yields 31 samples of the plain part, so a few whole
    steps give a tight interval where whole-step timing needs many. The parts are taken as
    independent; the interval uses Welch-Satterthwaite degrees of freedom (see step_estimate_df)."""
    mean, std, se, df = _estimate_parts(micro, boundary, accumulation)
    return mean, std, t95_df(df) * se


def step_estimate_df(micro: list[float], boundary: list[float], accumulation: int) -> float:
    """Degrees of freedom of step_estimate's interval: what a comparison of two estimates, or
    a combination of several, needs to keep their interval a true 95% one."""
    return _estimate_parts(micro, boundary, accumulation)[3]


def _estimate_parts(micro: list[float], boundary: list[float], g: int) -> tuple[float, float, float, float]:
    """Mean, standard deviation, standard error and degrees of freedom of the step estimate."""
    if g <= 1 or not micro:
        mean, std, _ = summarize(boundary)
        n = len(boundary)
        return mean, std, (std / math.sqrt(n) if n > 1 else math.inf), n - 1.0
    mb, sb, _ = summarize(boundary)
    mm, sm, _ = summarize(micro)
    if len(boundary) < 2 or len(micro) < 2:
        return (g - 1) * mm + mb, math.nan, math.inf, 0.0
    parts = [((g - 1) ** 2 * sm * sm / len(micro), len(micro)), (sb * sb / len(boundary), len(boundary))]
    se = math.sqrt(sum(v for v, _ in parts))
    return (g - 1) * mm + mb, math.sqrt((g - 1) * sm * sm + sb * sb), se, welch_df(parts)


def estimate_is_stable(
    estimate: tuple[float, float, float], *, whole_steps: int, min_steps: int, rel_ci: float
) -> bool:
    """True once enough was measured and the 95% interval is within ``rel_ci`` of the mean."""
    mean, _, ci = estimate
    return whole_steps >= min_steps and math.isfinite(ci) and ci <= rel_ci * mean


NOISE_FLOOR = 0.01
"""Relative differences below this are never called real, however tight the intervals."""


class Figure(NamedTuple):
    """A measured metric as comparisons read it: its value, its 95% half-width, the step time's
    relative standard error and that error's degrees of freedom (inf: known exactly)."""

    value: float
    ci: float
    rel_se: float
    df: float


def within_noise_of(a: Figure, b: Figure) -> bool:
    """True when the difference of ``a`` and ``b`` is inside the 95% interval of the difference
    (or below NOISE_FLOOR)."""
    return abs(a.value - b.value) <= max(math.hypot(a.ci, b.ci), NOISE_FLOOR * max(abs(a.value), abs(b.value)))


def faster_bound(c: Figure, than: Figure, *, maximize: bool) -> float:
    """How much faster, as a fraction, ``c`` can be than ``than`` at 95% confidence: the relative
    difference plus a one-sided Student-t bound on it (Welch-Satterthwaite degrees of freedom of
    both). Every metric is a step time or its reciprocal, so their relative standard errors are
    the step times'. Infinite where either has no error estimate."""
    if not (math.isfinite(c.rel_se) and math.isfinite(than.rel_se)):
        return math.inf
    ratio = c.value / than.value if maximize else than.value / c.value  # > 1: c is faster
    se = ratio * math.hypot(c.rel_se, than.rel_se)
    df = welch_df([(c.rel_se**2, c.df + 1), (than.rel_se**2, than.df + 1)])
    return ratio - 1 + t95_df(df, one_sided=True) * se


def pair_settled(a: Figure, b: Figure, *, maximize: bool, margin: float) -> bool:
    """Whether measuring more cannot change the choice between ``a`` and ``b`` by more than
    ``margin``: they differ beyond noise, or the slower one is shown (one-sided, at 95%) at most
    ``margin`` faster than the other. For two candidates this is exactly what the confirmation's
    settled() asks of the pick made between them, whichever it picks (the headroom rule picks
    the slower one only where the faster is shown within the margin, a stronger condition)."""
    fast, slow = (a, b) if (a.value >= b.value) == maximize else (b, a)
    return not within_noise_of(a, b) or faster_bound(slow, fast, maximize=maximize) <= margin


def measured_on(f: Figure, more: float) -> Figure:
    """``f`` as it would read after ``more`` further samples at the same mean and spread: its
    standard error shrinking as one over the root of the count (taken as df + 1)."""
    n = f.df + 1
    rel, df = f.rel_se * math.sqrt(n / (n + more)), f.df + more
    return Figure(f.value, f.value * rel * t95_df(df), rel, df)


def settle_verdict(mine: Figure, settle: dict, *, more: float) -> str:
    """A re-measurement measured against the candidate leading a confirmation (``settle``, see
    TrialJob.settle): "settled" once the choice between the two is answered (pair_settled),
    "open" while the ``more`` steps it may still take could answer it (they would, at its mean
    and spread so far), "out of reach" where they could not (then it ends, and a second round
    measures both)."""
    other = Figure(settle["value"], settle["ci"], settle["rel_se"], math.inf if settle["df"] is None else settle["df"])
    kw = {"maximize": settle["maximize"], "margin": settle["margin"]}
    if pair_settled(mine, other, **kw):
        return "settled"
    return "open" if more >= 1 and pair_settled(measured_on(mine, more), other, **kw) else "out of reach"


def slower_beyond(mine: tuple[float, float, float], than: tuple[float, float, float]) -> bool:
    """Whether a time (per step or per sample) estimated as ``mine`` is longer than ``than`` even
    at the optimistic end of a one-sided 95% bound on their difference. Each is (mean, standard
    error, degrees of freedom; inf: known exactly), and the bound is Welch's: the leader a trial
    is stopped against was itself measured on a few noisy steps, and taking its figure as exact
    would stop a contender that only its noise put behind. Against an exact figure this is the
    one-sample bound: mean minus t times its standard error."""
    (a, se_a, df_a), (b, se_b, df_b) = mine, than
    if not (math.isfinite(se_a) and math.isfinite(se_b)):
        return False
    t = t95_df(welch_df([(se_a * se_a, df_a + 1), (se_b * se_b, df_b + 1)]), one_sided=True)
    return math.isfinite(t) and a - t * math.hypot(se_a, se_b) > b
