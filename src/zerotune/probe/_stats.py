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


def welch_df(parts: list[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent means, each given as
    (its variance, its sample count)."""
    num = sum(v for v, _ in parts) ** 2
    den = sum(v * v / (n - 1) for v, n in parts if n > 1 and v > 0)
    return num / den if den > 0 else math.inf


def step_estimate(micro: list[float], boundary: list[float], accumulation: int) -> tuple[float, float, float]:
    """Mean, standard deviation and 95% half-width of one optimizer step's time, estimated from
    its parts: ``accumulation - 1`` plain micro-steps (forward, backward) and one boundary
    micro-step (forward, backward, gradient reduction, optimizer step), timed separately. At
    accumulation 32 one whole step then yields 31 samples of the plain part, so a few whole
    steps give a tight interval where whole-step timing needs many. The parts are taken as
    independent; the interval uses Welch-Satterthwaite degrees of freedom."""
    g = accumulation
    mb, sb, _ = summarize(boundary)
    if g <= 1 or not micro:
        return summarize(boundary)
    mm, sm, _ = summarize(micro)
    if len(boundary) < 2 or len(micro) < 2:
        return (g - 1) * mm + mb, math.nan, math.inf
    parts = [((g - 1) ** 2 * sm * sm / len(micro), len(micro)), (sb * sb / len(boundary), len(boundary))]
    se = math.sqrt(sum(v for v, _ in parts))
    df = welch_df(parts)
    t = t95(int(min(df, 1e6)) + 1) if math.isfinite(df) else 1.96
    return (g - 1) * mm + mb, math.sqrt((g - 1) * sm * sm + sb * sb), t * se


def estimate_is_stable(estimate: tuple[float, float, float], *, whole_steps: int, min_steps: int,
                       rel_ci: float) -> bool:
    """True once enough was measured and the 95% interval is within ``rel_ci`` of the mean."""
    mean, _, ci = estimate
    return whole_steps >= min_steps and math.isfinite(ci) and ci <= rel_ci * mean
