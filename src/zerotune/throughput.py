"""Predict, then verify: a throughput model fitted to the trials so far ranks what is still
untried, and a configuration predicted to be clearly worse than the best, beyond the error the
model showed on the trials it predicted, is pruned instead of launched.

Per variant (a stage with its overrides: offload, knobs), the time per sample against the
micro-batch is ``tau(mb) = p + q / mb``: a cost per sample, plus a cost per micro-step (launching
kernels, hooks, communication set-up) spread over the samples of the micro-step. At a fixed
global batch, accumulation only repeats micro-steps, so the same curve holds. Two trials of a
variant fit it (least squares); a variant with one trial takes the shape (q / p) of a fitted one,
scaled through its own trial: what a stage costs over another, from its first trial.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .trial import TrialResult, TrialSpec, TrialState

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


@dataclass
class _Curve:
    p: float
    q: float

    def tau(self, mb: int) -> float:
        return self.p + self.q / mb


@dataclass
class ThroughputModel:
    points: dict[tuple, dict[int, list[float]]] = field(default_factory=dict)
    """Per variant, per micro-batch: measured seconds per sample."""
    errors: list[tuple[str, float, float]] = field(default_factory=list)
    """(trial, predicted, measured) samples/s for every launched trial that had a prediction."""

    @staticmethod
    def variant(spec: TrialSpec) -> tuple:
        return (spec.stage, spec.overrides)

    def observe(self, result: TrialResult) -> None:
        m = result.measurement
        if result.state is not TrialState.OK or m is None or m.throughput <= 0:
            return
        self.points.setdefault(self.variant(result.spec), {}).setdefault(result.spec.micro_batch, []).append(
            1.0 / m.throughput)

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

    def _fit(self, variant: tuple) -> _Curve | None:
        pts = [(1.0 / mb, sum(v) / len(v)) for mb, v in self.points.get(variant, {}).items()]
        if len(pts) < 2:
            return None
        n = len(pts)
        mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        q = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx > 0 else 0.0
        q = max(q, 0.0)  # a per-micro-step cost is never negative; noise can make it look so
        return _Curve(p=my - q * mx, q=q)

    def predict(self, spec: TrialSpec) -> Prediction | None:
        """The throughput of ``spec``, or None where nothing it could rest on was measured."""
        variant, mb = self.variant(spec), spec.micro_batch
        curve = self._fit(variant)
        if curve is not None and curve.tau(mb) > 0:
            n = sum(len(v) for v in self.points[variant].values())
            return Prediction(1.0 / curve.tau(mb), f"a fit to its variant's {n} trials")
        own = self.points.get(variant)
        if not own:
            return None
        shapes = [(v, c) for v in self.points if v != variant and (c := self._fit(v)) is not None and c.p > 0]
        if not shapes:
            return None
        # Prefer the shape of the same stage (another offload or knob setting), else the closest stage.
        donor, shape = min(shapes, key=lambda vc: (vc[0][0] != spec.stage, abs(vc[0][0] - spec.stage)))
        mb0, taus = min(own.items(), key=lambda kv: abs(kv[0] - mb))
        ratio = shape.q / shape.p
        tau = (sum(taus) / len(taus)) * (1 + ratio / mb) / (1 + ratio / mb0)
        return Prediction(1.0 / tau, f"its trial at micro-batch {mb0} on the curve of z{donor[0]}")

    def table(self) -> str:
        """Predicted against measured, for the summary."""
        if not self.errors:
            return ""
        pairs = ", ".join(f"{name} {p:.1f}/{m:.1f}" for name, p, m in self.errors)
        return (f"throughput model, predicted/measured samples/s: {pairs}; its error so far: at most "
                f"{max(abs(p - m) / m for _, p, m in self.errors):.0%} over {len(self.errors)} trial(s)")
