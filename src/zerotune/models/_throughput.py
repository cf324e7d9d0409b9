"""Predict, then verify: a throughput model fitted to the trials so far ranks what is still
untried, and a configuration predicted to be clearly worse than the best, beyond the error the
model showed on the trials it predicted and beyond the noise of the trials the prediction rests
on, is pruned instead of launched.

Per variant (a stage with its overrides: offload, knobs), the time per sample against the
micro-batch is ``tau(mb) = p + q / mb``: a cost per sample, plus a cost per micro-step (launching
kernels, hooks, communication set-up) spread over the samples of the micro-step. At a fixed
global batch, accumulation only repeats micro-steps, so the same curve holds. Two trials of a
variant fit it (least squares); a variant with one trial takes the shape (q / p) of a fitted one,
scaled through its own trial: what a stage costs over another, from its first trial.

Each prediction carries the 95% interval its trials' own intervals give it (propagated through
the fit). An extrapolation amplifies them: from micro-batches 32 and 16 to 8 the prediction is
3 x tau(16) - 2 x tau(32), so a trial measured at ±29% (three steps in a noisy hour) leaves the
prediction at 8 open up to 92 samples/s; without its interval a prediction of 23 could prune a
config that measures 31 and is the best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..trials import TrialResult, TrialSpec, TrialState

ERROR_FLOOR = 0.05
"""The model is never trusted to better than this relative error."""
VERIFIED_AFTER = 2
"""Predictions checked against measurements before the model may prune anything."""


@dataclass(frozen=True)
class Prediction:
    throughput: float
    """Samples per second."""
    basis: str
    """What it rests on, for the reason of a pruned trial."""
    upper: float = math.inf
    """The upper end of the prediction's 95% interval, from the intervals of the trials it rests
    on (inf: they do not bound it)."""


@dataclass(frozen=True)
class _Point:
    x: float
    """1 / micro-batch."""
    tau: float
    """Seconds per sample."""
    ci: float
    """Its 95% half-width (inf: unknown)."""


@dataclass
class _Curve:
    p: float
    q: float
    """The slope, at least 0: a per-micro-step cost is never negative, noise can make it look so."""
    pts: list[_Point]
    mx: float
    my: float
    raw_q: float
    """The least-squares slope before it was held at 0: the fast end of an interval starts from it."""
    slope_weights: list[float]
    """Per point, its weight in the raw slope: what carries the points' intervals to it."""

    def tau(self, mb: int) -> float:
        return self.p + self.q / mb

    def slope_half(self) -> float:
        """The 95% half-width of the raw slope, from the points' (independent, in quadrature)."""
        return math.sqrt(sum((w * pt.ci) ** 2 for w, pt in zip(self.slope_weights, self.pts)))

    def upper(self, mb: int) -> float:
        """The throughput at the fast end of the 95% interval of tau at ``mb``: the raw line's
        value there, a weighted sum of the points' (1/n + (x - mean x) x slope weight each), less
        its half-width, from the held line's value where that is faster."""
        x, n = 1.0 / mb, len(self.pts)
        raw = self.my + self.raw_q * (x - self.mx)
        half = math.sqrt(sum(((1 / n + (x - self.mx) * w) * pt.ci) ** 2 for w, pt in zip(self.slope_weights, self.pts)))
        return _upper(min(raw, self.tau(mb)), half)


def _fit(pts: list[_Point]) -> _Curve | None:
    """The least-squares line tau = p + q x through ``pts``, or None below two points."""
    if len(pts) < 2:
        return None
    n = len(pts)
    mx, my = sum(pt.x for pt in pts) / n, sum(pt.tau for pt in pts) / n
    sxx = sum((pt.x - mx) ** 2 for pt in pts)
    weights = [(pt.x - mx) / sxx if sxx > 0 else 0.0 for pt in pts]
    raw = sum(w * pt.tau for w, pt in zip(weights, pts))
    q = max(raw, 0.0)
    return _Curve(p=my - q * mx, q=q, pts=pts, mx=mx, my=my, raw_q=raw, slope_weights=weights)


def _upper(tau: float, half: float) -> float:
    """The throughput at the fast end of tau's interval (inf where the interval reaches zero)."""
    return 1.0 / (tau - half) if math.isfinite(half) and tau > half else math.inf


@dataclass
class ThroughputModel:
    points: dict[tuple, dict[int, list[tuple[float, float]]]] = field(default_factory=dict)
    """Per variant, per micro-batch: measured seconds per sample and its 95% half-width."""
    errors: list[tuple[str, float, float]] = field(default_factory=list)
    """(trial, predicted, measured) samples/s for every launched trial that had a prediction."""

    @staticmethod
    def variant(spec: TrialSpec) -> tuple:
        """Stage, overrides and engine: trials of one variant differ in the micro-batch only."""
        return (spec.stage, spec.overrides, spec.engine)

    def observe(self, result: TrialResult) -> None:
        m = result.measurement
        if result.state is not TrialState.OK or m is None or m.throughput <= 0:
            return
        tau = 1.0 / m.throughput
        rel = m.step_time_ci95 / m.step_time_mean  # per sample as per step: the same relative interval
        self.points.setdefault(self.variant(result.spec), {}).setdefault(result.spec.micro_batch, []).append(
            (tau, tau * rel if math.isfinite(rel) else math.inf)
        )

    def verify(self, name: str, prediction: Prediction | None, result: TrialResult) -> None:
        """Record how far ``prediction`` (made before the trial ran) was from what it measured."""
        if prediction is not None and result.state is TrialState.OK and result.measurement is not None:
            self.errors.append((name, prediction.throughput, result.measurement.throughput))

    @property
    def error(self) -> float:
        """The model's relative error so far: the largest it made, at least ERROR_FLOOR."""
        return max([ERROR_FLOOR] + [abs(p - m) / m for _, p, m in self.errors])

    @property
    def verified(self) -> bool:
        return len(self.errors) >= VERIFIED_AFTER

    def _points(self, variant: tuple) -> list[_Point]:
        """The variant's trials, one point per micro-batch: repeats as their mean, its interval
        theirs in quadrature over their count."""
        out = []
        for mb, runs in self.points.get(variant, {}).items():
            k = len(runs)
            out.append(_Point(1.0 / mb, sum(t for t, _ in runs) / k, math.sqrt(sum(c * c for _, c in runs)) / k))
        return out

    def predict(self, spec: TrialSpec) -> Prediction | None:
        """The throughput of ``spec``, or None where nothing it could rest on was measured."""
        variant, mb = self.variant(spec), spec.micro_batch
        own = self._points(variant)
        curve = _fit(own)
        if curve is not None and curve.tau(mb) > 0:
            n = sum(len(v) for v in self.points[variant].values())
            return Prediction(1.0 / curve.tau(mb), f"a fit to its variant's {n} trials", upper=curve.upper(mb))
        if not own:
            return None
        shapes = [(v, c) for v in self.points if v != variant and (c := _fit(self._points(v))) is not None and c.p > 0]
        if not shapes:
            return None
        # Prefer the shape of the same engine and stage (another offload or knob setting), else the closest stage.
        donor, shape = min(
            shapes, key=lambda vc: (vc[0][2] != spec.engine, vc[0][0] != spec.stage, abs(vc[0][0] - spec.stage))
        )
        base = min(own, key=lambda pt: abs(1.0 / pt.x - mb))
        mb0 = round(1.0 / base.x)

        def scaled(q: float) -> float:
            """The base trial's tau carried to ``mb`` along the donor's line of slope ``q`` (its
            p moving with it through the donor's mean)."""
            ratio = q / (shape.my - q * shape.mx)
            return base.tau * (1 + ratio / mb) / (1 + ratio / mb0)

        tau = scaled(shape.q)
        # Both ends of the donor's slope interval, in quadrature with the base trial's own.
        q_half = shape.slope_half()
        ends = [max(0.0, shape.raw_q - q_half), max(0.0, shape.raw_q + q_half)]
        if math.isfinite(q_half) and all(shape.my - q * shape.mx > 0 for q in ends):
            half = math.hypot(tau * base.ci / base.tau, max(abs(scaled(q) - tau) for q in ends))
        else:
            half = math.inf
        return Prediction(
            1.0 / tau, f"its trial at micro-batch {mb0} on the curve of z{donor[0]}", upper=_upper(tau, half)
        )

    def table(self) -> str:
        """Predicted against measured, for the summary."""
        if not self.errors:
            return ""
        pairs = ", ".join(f"{name} {p:.1f}/{m:.1f}" for name, p, m in self.errors)
        return (
            f"throughput model, predicted/measured samples/s: {pairs}; its error so far: at most "
            f"{max(abs(p - m) / m for _, p, m in self.errors):.0%} over {len(self.errors)} trial(s)"
        )
