"""Peak memory per rank as a function of the micro-batch, calibrated from trials.

peak(mb) = static + per_sample * mb, per stage. ``static`` is what the rank holds before the
first forward (model states, buffers, runtime); ``per_sample`` is activation memory growth.
A stage with trials gets its own fit. A stage never measured gets the analytic terms of
:mod:`memory_terms` (model states, ZeRO buffers, offload) plus what the measured stages say
the model leaves out: the fixed overhead and activations per sample, fitted from their residuals.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .memory_terms import MemorySetup, estimate
from .trial import TrialResult, TrialState


def model_states(setup: MemorySetup) -> float:
    """Device bytes of model states and ZeRO buffers alone (no activations, no overhead)."""
    b = estimate(setup, 0)
    return b.device_total - b.device["overhead"] - b.device["activations"]


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
    """Collects per-rank peaks from trials and predicts peaks of untried micro-batches.

    ``setup_for(stage, num_params)`` gives the analytic setup of a stage (precision, offload,
    buckets from the user's config); default: Adam in fp32 (or mixed when ``mixed_precision``)."""

    def __init__(self, *, dp: int, mixed_precision: bool,
                 setup_for: Callable[[int, int], MemorySetup] | None = None):
        self.dp = dp
        self.mixed_precision = mixed_precision
        self.setup_for = setup_for or (lambda stage, n: MemorySetup(
            num_params=n, dp=dp, stage=stage, precision="bf16" if mixed_precision else "fp32",
            reduce_bucket_size=0, allgather_bucket_size=0, prefetch_bucket_size=0))
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
        if not self.points:
            return None
        if self.num_params is None:  # no parameter count: the nearest measured stage as it is
            return _fit(min(self.points.items(), key=lambda kv: abs(kv[0] - stage))[1])
        states = {s: model_states(self.setup_for(s, self.num_params)) for s in [*self.points, stage]}
        # What the analytic terms leave out (overhead, activations), from every measured stage.
        residual = [Point(p.micro_batch, int(p.peak - states[s]), int(p.static - states[s]))
                    for s, pts in self.points.items() for p in pts]
        base = _fit(residual)
        return LinearFit(base.static + states[stage], base.per_sample, base.exact)


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
