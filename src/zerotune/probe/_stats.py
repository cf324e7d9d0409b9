"""Statistics of step times, kept free of torch so the tuner can use them too."""
from __future__ import annotations

import math
import statistics

# Two-sided 95% Student-t quantiles for n-1 degrees of freedom; beyond 30 the normal value.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045]


def t95(n: int) -> float:
    return _T95[n - 2] if 2 <= n <= len(_T95) + 1 else 1.96


def summarize(intervals: list[float]) -> tuple[float, float, float]:
    """Mean, standard deviation and 95% half-width of the mean of step times."""
    n = len(intervals)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = statistics.fmean(intervals)
    if n == 1:
        return mean, 0.0, math.inf
    std = statistics.stdev(intervals)
    return mean, std, t95(n) * std / math.sqrt(n)


def is_stable(intervals: list[float], *, min_steps: int, rel_ci: float) -> bool:
    """True once at least ``min_steps`` were measured and the 95% interval of the mean is
    within ``rel_ci`` (a fraction) of it."""
    if len(intervals) < max(2, min_steps):
        return False
    mean, _, ci = summarize(intervals)
    return ci <= rel_ci * mean
