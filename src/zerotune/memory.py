"""Peak memory per rank as a function of the micro-batch, fitted from trials.

peak(mb) = static + per_sample * mb, per stage. ``static`` is what the rank holds before the
first forward (model states, buffers, runtime); ``per_sample`` is activation memory growth.
A stage never measured borrows another stage's fit, moving its static part by the difference of
ZeRO model-state bytes between the two stages.
"""
from __future__ import annotations

from dataclasses import dataclass

from .trial import TrialResult, TrialState


def model_state_bytes(stage: int, num_params: int, dp: int, *, mixed_precision: bool) -> float:
    """Parameters, gradients and Adam states held by one rank (DeepSpeed's ZeRO paper terms)."""
    p, g, o = (2, 2, 12) if mixed_precision else (4, 4, 8)
    if stage >= 1:
        o /= dp
    if stage >= 2:
        g /= dp
    if stage >= 3:
        p /= dp
    return (p + g + o) * num_params


@dataclass
class Point:
    micro_batch: int
    peak: int
    static: int


@dataclass
class LinearFit:
    static: float
    per_sample: float
    exact: bool
    """True when fitted from two or more micro-batches; False when per_sample is the
    conservative (over-)estimate (peak - static) / mb from one trial."""

    def predict(self, micro_batch: int) -> float:
        return self.static + self.per_sample * micro_batch


class MemoryModel:
    """Collects per-rank peaks from trials and predicts peaks of untried micro-batches."""

    def __init__(self, *, dp: int, mixed_precision: bool):
        self.dp = dp
        self.mixed_precision = mixed_precision
        self.points: dict[int, list[Point]] = {}
        self.num_params: int | None = None

    def observe(self, result: TrialResult) -> None:
        if result.state is not TrialState.OK or not result.peak_memory or not result.static_memory:
            return
        self.num_params = self.num_params or result.num_params
        self.points.setdefault(result.spec.stage, []).append(
            Point(result.spec.micro_batch, max(result.peak_memory), max(result.static_memory)))

    def fit(self, stage: int) -> LinearFit | None:
        pts = self.points.get(stage)
        if pts:
            return _fit(pts)
        for other, other_pts in sorted(self.points.items(), key=lambda kv: abs(kv[0] - stage)):
            base = _fit(other_pts)
            if self.num_params is None:
                return base
            shift = (model_state_bytes(stage, self.num_params, self.dp, mixed_precision=self.mixed_precision)
                     - model_state_bytes(other, self.num_params, self.dp, mixed_precision=self.mixed_precision))
            return LinearFit(base.static + shift, base.per_sample, base.exact)
        return None


def _fit(pts: list[Point]) -> LinearFit:
    mbs = {p.micro_batch for p in pts}
    if len(mbs) >= 2:
        n = len(pts)
        mx = sum(p.micro_batch for p in pts) / n
        my = sum(p.peak for p in pts) / n
        sxx = sum((p.micro_batch - mx) ** 2 for p in pts)
        slope = max(0.0, sum((p.micro_batch - mx) * (p.peak - my) for p in pts) / sxx)
        return LinearFit(my - slope * mx, slope, True)
    p = max(pts, key=lambda q: q.peak)
    return LinearFit(float(p.static), max(0.0, (p.peak - p.static) / p.micro_batch), False)
