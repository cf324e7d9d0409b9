"""Experiment tracking from the tuning's events: MLflow (a parent run with one nested run per
trial) when mlflow is installed and a tracking URI is set, and TensorBoard scalars on request.

Both are sinks of :class:`~zerotune.TuningEvent`s, like the terminal printer: the core
knows nothing of them, and neither is imported unless used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TRIAL_EVENTS = ("finished", "reused", "pruned")


def _params(result) -> dict[str, Any]:
    spec = result.spec
    out: dict[str, Any] = {"stage": spec.stage, "micro_batch": spec.micro_batch, "grad_accum": spec.grad_accum}
    out.update({k: v for k, v in spec.overrides})
    return out


def _metrics(result, metric: str) -> dict[str, float]:
    out: dict[str, float] = {}
    m = result.measurement
    if m is not None:
        out.update(
            throughput=m.throughput,
            throughput_ci95=m.throughput_ci95,
            latency=m.step_time_mean,
            latency_ci95=m.step_time_ci95,
        )
        if m.flops is not None:
            out["flops"] = m.flops
    if result.max_peak:
        out["peak_memory_bytes"] = float(result.max_peak)
    return out


def mlflow_wanted() -> bool:
    """mlflow importable and a tracking URI set (MLFLOW_TRACKING_URI)."""
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        return False
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


class MlflowTracker:
    """A parent run for the tuning; each trial a nested run with its config as params, its
    measurements as metrics and its state and reason as tags."""

    def __init__(self, run_name: str = "zerotune"):
        import mlflow

        self.mlflow = mlflow
        self.run_name = run_name
        self.parent = None
        self.metric = "throughput"

    def start(self, tuner) -> None:
        self.metric = tuner.request.autotuning.metric
        self.parent = self.mlflow.start_run(run_name=f"{self.run_name}: {Path(tuner.command.script).name}")
        self.mlflow.log_params(
            {
                "script": tuner.command.script,
                "num_gpus": tuner.num_gpus,
                "num_nodes": tuner.num_nodes,
                "metric": self.metric,
                "tuner_type": tuner.request.autotuning.tuner_type,
                "memory_per_device": tuner.budget,
            }
        )

    def __call__(self, event) -> None:
        if self.parent is None or event.kind not in TRIAL_EVENTS:
            return
        r = event.result
        with self.mlflow.start_run(run_name=r.name, nested=True):
            self.mlflow.log_params(_params(r))
            self.mlflow.set_tags(
                {
                    "state": r.state.value,
                    "reason": r.reason[:500],
                    "source": "from disk" if event.kind == "reused" else "measured",
                }
            )
            if metrics := _metrics(r, self.metric):
                self.mlflow.log_metrics(metrics)

    def end(self, result, status: str = "FINISHED") -> None:
        if self.parent is None:
            return
        if result is not None and result.best is not None:
            self.mlflow.set_tag("best_trial", result.best.name)
            # The figures the choice was made on (re-measured, where the ties were measured again).
            best = result.figure(result.best)
            self.mlflow.log_metrics({f"best_{k}": v for k, v in _metrics(best, self.metric).items()})
            optimal = Path(result.results_dir) / "ds_config_optimal.json"
            if optimal.exists():
                self.mlflow.log_artifact(str(optimal))
        self.mlflow.end_run(status=status)
        self.parent = None


class TensorBoardTracker:
    """Scalars per trial (x: the trial's index): the metric, peak memory, and the best so far."""

    def __init__(self, logdir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            from .._errors import ConfigError

            raise ConfigError(f"--tensorboard needs the tensorboard package ({e}); pip install tensorboard") from None
        self.writer = SummaryWriter(str(logdir))
        self.metric = "throughput"
        self.best: float | None = None
        self.step = 0

    def start(self, tuner) -> None:
        self.metric = tuner.request.autotuning.metric

    def __call__(self, event) -> None:
        if event.kind not in TRIAL_EVENTS:
            return
        r = event.result
        self.step += 1
        value = r.metric(self.metric)
        if value is not None:
            self.writer.add_scalar(f"trial/{self.metric}", value, self.step)
            lower = self.metric == "latency"
            if self.best is None or (value < self.best if lower else value > self.best):
                self.best = value
        if self.best is not None:
            self.writer.add_scalar(f"best/{self.metric}", self.best, self.step)
        if r.max_peak:
            self.writer.add_scalar("trial/peak_memory_gib", r.max_peak / 2**30, self.step)
        self.writer.add_text("trial/state", f"{r.name}: {r.state.value} {r.reason}", self.step)

    def end(self, result, status: str = "FINISHED") -> None:
        self.writer.flush()
        self.writer.close()
