"""Peak memory per rank as a function of the micro-batch, calibrated from trials.

peak(mb) = static + per_sample * mb, per stage. ``static`` is what the rank holds before the
first forward (model states, buffers, runtime); ``per_sample`` is activation memory growth.
A stage with trials gets its own fit. A stage never measured gets the analytic terms of
:mod:`~zerotune.models._memory_terms` (model states, ZeRO buffers, offload) plus what the measured stages say
the model leaves out: the fixed overhead and activations per sample, fitted from their residuals.

Every prediction carries an uncertainty (one standard deviation, in bytes): the residual spread of
the fit, never below a prior of ``PRIOR_REL`` of the peak (run-to-run noise of a peak, which two
points cannot show), widened away from the measured micro-batches as a regression's prediction
interval is, and for a transferred stage widened again by the analytic terms' error. The search
keeps ``upper()`` under the budget, and prunes a whole stage only when ``lower()`` is above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..trials import TrialResult, TrialState
from ._memory_terms import MemorySetup, estimate


def model_states(setup: MemorySetup) -> float:
    """Device bytes of model states and ZeRO buffers alone (no activations, no overhead)."""
    b = estimate(setup, 0)
    return b.device_total - b.device["overhead"] - b.device["activations"]


@dataclass
class Point:
    micro_batch: int
    peak: int
    static: int


PRIOR_REL = 0.02
"""Relative spread of a measured peak that a fit through two points cannot show (allocator slack,
run-to-run noise); the bench's held-out errors on CPU are of this order."""
TRANSFER_REL = 0.10
"""Relative error of the analytic terms' change between a measured and an unmeasured stage."""
Z = 2.0
"""Standard deviations of margin: about 95% of peaks fall below ``upper()``."""


@dataclass
class LinearFit:
    static: float
    per_sample: float
    exact: bool
    """True when fitted from two or more micro-batches; False when per_sample is the
    conservative (over-)estimate (peak - static) / mb from one trial."""
    sigma: float = 0.0
    """Spread of a measured peak around the line, in bytes (0 for a one-trial over-estimate)."""
    n: int = 1
    mean_mb: float = 0.0
    sxx: float = 0.0
    """Points, their mean micro-batch and sum of squared deviations: the prediction interval widens
    away from the measured micro-batches."""
    transfer: float = 0.0
    """Extra spread, in bytes, of a stage predicted from other stages' measurements."""

    def predict(self, micro_batch: int) -> float:
        return self.static + self.per_sample * micro_batch

    def uncertainty(self, micro_batch: int) -> float:
        """One standard deviation of the prediction at this micro-batch, in bytes."""
        if not self.exact:
            return self.transfer
        spread = 1 + 1 / self.n + ((micro_batch - self.mean_mb) ** 2 / self.sxx if self.sxx else 0.0)
        return math.sqrt(self.sigma**2 * spread + self.transfer**2)

    def upper(self, micro_batch: int) -> float:
        return self.predict(micro_batch) + Z * self.uncertainty(micro_batch)

    def lower(self, micro_batch: int) -> float:
        # From one trial the slope is an over-estimate: only the static part is a sure minimum.
        sure = self.predict(micro_batch) if self.exact else self.static
        return sure - Z * self.uncertainty(micro_batch)


class MemoryModel:
    """Collects per-rank peaks from trials and predicts peaks of untried micro-batches.

    ``setup_for(stage, num_params)`` gives the analytic setup of a stage (precision, offload,
    buckets from the user's config); default: Adam in fp32 (or mixed when ``mixed_precision``).
    ``num_params``, when known before any trial, lets stages be pruned by model states alone."""

    def __init__(
        self,
        *,
        dp: int,
        mixed_precision: bool,
        setup_for: Callable[[int, int], MemorySetup] | None = None,
        num_params: int | None = None,
    ):
        self.dp = dp
        self.mixed_precision = mixed_precision
        self.setup_for = setup_for or (
            lambda stage, n: MemorySetup(
                num_params=n,
                dp=dp,
                stage=stage,
                precision="bf16" if mixed_precision else "fp32",
                reduce_bucket_size=0,
                allgather_bucket_size=0,
                prefetch_bucket_size=0,
            )
        )
        self.points: dict[int, list[Point]] = {}
        self.num_params = num_params
        """Known before any trial (model_info, a Lightning model) or from the first trial."""
        self.floors: dict[tuple[int, tuple], list[Point]] = {}
        """Per stage and overrides, its trials that ran out of memory: what they held when they did."""

    def observe(self, result: TrialResult) -> None:
        if result.state in (TrialState.OK, TrialState.OOM):
            # The engine was built (a trial that ran out of memory did so in a step): its count
            # of parameters holds whatever the memory.
            self.num_params = self.num_params or result.num_params
        if result.state is TrialState.OOM and result.peak_memory:
            self.floors.setdefault((result.spec.stage, result.spec.overrides), []).append(
                Point(result.spec.micro_batch, max(result.peak_memory), max(result.static_memory or [0]))
            )
            return
        if result.state is not TrialState.OK or not result.peak_memory or not result.static_memory:
            return
        self.points.setdefault(result.spec.stage, []).append(
            Point(result.spec.micro_batch, max(result.peak_memory), max(result.static_memory))
        )

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
        residual = {
            s: [Point(p.micro_batch, int(p.peak - states[s]), int(p.static - states[s])) for p in pts]
            for s, pts in self.points.items()
        }
        peaks = [p.peak for pts in self.points.values() for p in pts]
        base = _fit([p for pts in residual.values() for p in pts], scale=sum(peaks) / len(peaks))
        # The analytic terms are trusted for what changes between stages to TRANSFER_REL of the
        # change from the nearest measured stage; with several measured stages, only as far as
        # their residual statics agree.
        change = min(abs(states[stage] - states[s]) for s in self.points)
        statics = [_fit(pts).static for pts in residual.values()]
        transfer = math.hypot(TRANSFER_REL * change, (max(statics) - min(statics)) / 2)
        return LinearFit(
            base.static + states[stage],
            base.per_sample,
            base.exact,
            base.sigma,
            base.n,
            base.mean_mb,
            base.sxx,
            transfer,
        )

    def floor(self, stage: int, micro_batch: int, overrides: tuple = ()) -> tuple[float, Point] | None:
        """What ``micro_batch`` needs at least by the stage's out-of-memory trials (with these
        overrides), with the trial that shows it; None without such a trial. A trial that ran out
        at micro-batch m held P when it stopped, so it needed at least P: a larger micro-batch needs
        that too, and a smaller one at least the line from the trial's static S to P, since its
        peak is C + a * mb with C >= S (what the rank held before the first forward stays). Less
        ``Z`` prior spreads, as a measured peak may read that much high. On a lent H200 a budget of
        600 MB was exceeded at micro-batch 8 (2.26 GiB: DeepSpeed's reduce bucket alone took 1.9
        GiB) and the search then launched micro-batch 2 (2.16 GiB), which this bound, 0.66 GiB,
        shows cannot fit."""
        best: tuple[float, Point] | None = None
        for p in self.floors.get((stage, overrides), []):
            share = min(1.0, micro_batch / p.micro_batch)
            need = (p.peak * share + min(p.static, p.peak) * (1 - share)) * (1 - Z * PRIOR_REL)
            if best is None or need > best[0]:
                best = (need, p)
        return best

    def lower_bound(self, stage: int, micro_batch: int) -> float | None:
        """What a stage needs at least (``Z`` standard deviations below its prediction), or
        without any trial, its model states alone when the parameter count is known; None
        when nothing is known."""
        fit = self.fit(stage)
        if fit is not None:
            return fit.lower(micro_batch)
        if self.num_params is None:
            return None
        return model_states(self.setup_for(stage, self.num_params)) * (1 - Z * TRANSFER_REL)


def _fit(pts: list[Point], scale: float | None = None) -> LinearFit:
    """Least squares through the points; ``scale``: the peak size the prior spread is relative to
    (default: the points' own mean)."""
    mbs = {p.micro_batch for p in pts}
    if len(mbs) >= 2:
        n = len(pts)
        mx = sum(p.micro_batch for p in pts) / n
        my = sum(p.peak for p in pts) / n
        sxx = sum((p.micro_batch - mx) ** 2 for p in pts)
        slope = max(0.0, sum((p.micro_batch - mx) * (p.peak - my) for p in pts) / sxx)
        static = my - slope * mx
        ssr = sum((p.peak - static - slope * p.micro_batch) ** 2 for p in pts)
        sigma = math.sqrt(ssr / (n - 2)) if n > 2 else 0.0
        return LinearFit(static, slope, True, max(sigma, PRIOR_REL * (my if scale is None else scale)), n, mx, sxx)
    p = max(pts, key=lambda q: q.peak)
    return LinearFit(float(p.static), max(0.0, (p.peak - p.static) / p.micro_batch), False)
