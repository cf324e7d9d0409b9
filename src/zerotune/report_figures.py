"""The data behind the report's figures, and the figures (matplotlib, imported only here).

Each ``*_data`` function is pure: trials in, plain rows out, so that tests check what a figure
shows without looking at pixels.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .memory import MemoryModel
from .trial import TrialResult, TrialState

_BATCH = re.compile(r"_mb\d+_gas\d+")


def series_label(trial: TrialResult) -> str:
    """The trial's configuration apart from micro-batch and accumulation: one line per label."""
    return _BATCH.sub("", trial.name)


def throughput_data(trials: list[TrialResult], metric: str) -> dict[str, list[tuple[int, float, float]]]:
    """Per configuration (stage and knobs), ``(micro_batch, value, ci95)`` of its OK trials."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for t in trials:
        if t.state is TrialState.OK and t.metric(metric) is not None:
            out.setdefault(series_label(t), []).append((t.spec.micro_batch, t.metric(metric), t.metric_ci(metric) or 0.0))
    return {k: sorted(v) for k, v in sorted(out.items())}


@dataclass
class MemoryPoint:
    name: str
    stage: int
    micro_batch: int
    measured: int
    predicted: float | None


def memory_data(trials: list[TrialResult], dp: int) -> list[MemoryPoint]:
    """Measured per-rank peak of each OK trial against the memory model's prediction for it,
    the model calibrated on the OK trials of the same stage and offload (each trial left out of
    its own fit when its stage has three or more, so the prediction is a real one)."""
    ok = [t for t in trials if t.state is TrialState.OK and t.peak_memory and t.static_memory]
    points = []
    for t in ok:
        peers = [p for p in ok if p.spec.stage == t.spec.stage and p.spec.overrides == t.spec.overrides]
        others = [p for p in peers if p is not t] if len(peers) >= 3 else peers
        model = MemoryModel(dp=dp, mixed_precision=False)
        for p in others:
            model.observe(p)
        fit = model.fit(t.spec.stage)
        points.append(MemoryPoint(t.name, t.spec.stage, t.spec.micro_batch, t.max_peak,
                                  fit.predict(t.spec.micro_batch) if fit else None))
    return points


@dataclass
class Span:
    name: str
    state: str
    reason: str
    start: float
    end: float


def timeline_data(trials: list[TrialResult], results_dir: Path) -> list[Span]:
    """When each trial ran, relative to the first start: its result file's time minus its wall
    time (pruned trials take no time: they mark the moment they were decided)."""
    spans = []
    for t in trials:
        path = results_dir / t.name / "result.json"
        end = path.stat().st_mtime if path.exists() else 0.0
        spans.append(Span(t.name, t.state.value, t.reason, end - (t.wall_time or 0.0), end))
    if spans:
        origin = min(s.start for s in spans)
        for s in spans:
            s.start, s.end = s.start - origin, s.end - origin
    return sorted(spans, key=lambda s: s.start)


def config_diff(user: dict[str, Any], chosen: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, user's value, chosen value)`` for every key that differs (None: absent)."""
    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict) and v:
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat({k: v for k, v in user.items() if k != "autotuning"}), flat(chosen)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


# -- figures ---------------------------------------------------------------------------------------
COLORS = {"ok": "#2b8a3e", "oom": "#e8590c", "pruned": "#1c7ed6", "crashed": "#c92a2a", "timeout": "#862e9c"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _micro_batch_axis(ax, mbs) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(mbs))
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel("micro-batch per device")


def plot_throughput(data, metric: str, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in data.items():
        mbs, values, cis = zip(*rows)
        ax.errorbar(mbs, values, yerr=cis, marker="o", capsize=3, label=label)
    _micro_batch_axis(ax, [m for rows in data.values() for m, _, _ in rows])
    ax.set_ylabel({"throughput": "samples/s", "latency": "s per step", "flops": "FLOP/s"}[metric])
    ax.set_title(f"{metric} by micro-batch (95% intervals)")
    return _save(plt, fig, ax, path, legend=bool(data))


def plot_memory(points: list[MemoryPoint], budget: int | None, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    gib = 1024**3
    for i, stage in enumerate(sorted({p.stage for p in points})):
        color = f"C{i}"
        mine = [p for p in points if p.stage == stage]
        ax.scatter([p.micro_batch for p in mine], [p.measured / gib for p in mine], marker="o", color=color,
                   label=f"stage {stage} measured")
        pred = [p for p in mine if p.predicted is not None]
        ax.scatter([p.micro_batch for p in pred], [p.predicted / gib for p in pred], marker="x", color=color,
                   s=60, label=f"stage {stage} predicted")
    title = "peak memory: measured vs predicted"
    top = max((p.measured for p in points), default=0)
    if budget and budget <= 2 * top:
        ax.axhline(budget / gib, color="#c92a2a", linestyle="--", label="budget")
    elif budget:  # far above every peak: a line there would flatten the points
        title += f" (budget {budget / gib:.1f} GiB, off the scale)"
    _micro_batch_axis(ax, [p.micro_batch for p in points])
    ax.set_ylabel("peak memory per rank (GiB)")
    ax.set_title(title)
    return _save(plt, fig, ax, path, legend=bool(points))


def _save(plt, fig, ax, path: Path, *, legend: bool) -> Path:
    if legend:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(spans: list[Span], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.28 * len(spans) + 1)))
    for i, s in enumerate(spans):
        ax.barh(i, max(s.end - s.start, 0.5), left=s.start, color=COLORS.get(s.state, "#868e96"))
    ax.set_yticks(range(len(spans)), [s.name for s in spans], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first trial")
    ax.set_title("trials by state", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
