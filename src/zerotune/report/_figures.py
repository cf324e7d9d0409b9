"""The data behind the report's figures, and the figures (matplotlib, imported only here).

Each ``*_data`` function is pure: trials in, plain rows out, so that tests check what a figure
shows without looking at pixels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..models import MemoryModel
from ..trials import TrialResult, TrialState

_BATCH = re.compile(r"_mb\d+_gas\d+")


def series_label(trial: TrialResult) -> str:
    """The trial's configuration apart from micro-batch and accumulation: one line per label."""
    return _BATCH.sub("", trial.name)


MAX_SERIES = 12
"""Lines in the throughput figure: the configurations with the best values; more would make
neither a readable legend nor a bounded figure."""
MAX_LANES = 60
"""Rows of the timeline with a name each; beyond, trials share rows and go unnamed."""
LOO_LIMIT = 20
"""Above this many peers a memory prediction leaves out one of ten folds instead of one trial."""


def throughput_data(
    trials: list[TrialResult], metric: str, limit: int = MAX_SERIES
) -> dict[str, list[tuple[int, float, float]]]:
    """Per configuration (stage and knobs), ``(micro_batch, value, ci95)`` of its OK trials; the
    ``limit`` configurations with the best values."""
    from ..trials import MAXIMIZE

    out: dict[str, list[tuple[int, float, float]]] = {}
    for t in trials:
        if t.state is TrialState.OK and t.metric(metric) is not None:
            out.setdefault(series_label(t), []).append(
                (t.spec.micro_batch, t.metric(metric), t.metric_ci(metric) or 0.0)
            )
    sign = -1 if MAXIMIZE[metric] else 1
    kept = sorted(out, key=lambda k: min(sign * v for _, v, _ in out[k]))[:limit]
    return {k: sorted(out[k]) for k in sorted(kept)}


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
    groups: dict[tuple, list[TrialResult]] = {}
    for t in ok:
        groups.setdefault((t.spec.stage, t.spec.overrides), []).append(t)
    predicted: dict[int, float | None] = {}
    for peers in groups.values():
        # Each trial left out of its own fit; in a large group, one of ten folds (ten fits, not n).
        folds = len(peers) if len(peers) <= LOO_LIMIT else 10
        for fold in range(folds):
            held = peers[fold::folds]
            model = MemoryModel(dp=dp, mixed_precision=False)
            for p in peers if len(peers) < 3 else [p for p in peers if p not in held]:
                model.observe(p)
            for t in held:
                fit = model.fit(t.spec.stage)
                predicted[id(t)] = fit.predict(t.spec.micro_batch) if fit else None
    return [MemoryPoint(t.name, t.spec.stage, t.spec.micro_batch, t.max_peak, predicted.get(id(t))) for t in ok]


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
        try:
            end = (results_dir / t.name / "result.json").stat().st_mtime
        except OSError:
            end = 0.0
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
COLORS = {
    "ok": "#2b8a3e",
    "oom": "#e8590c",
    "pruned": "#1c7ed6",
    "crashed": "#c92a2a",
    "timeout": "#862e9c",
    "killed": "#495057",
}


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
        ax.scatter(
            [p.micro_batch for p in mine],
            [p.measured / gib for p in mine],
            marker="o",
            color=color,
            label=f"stage {stage} measured",
        )
        pred = [p for p in mine if p.predicted is not None]
        ax.scatter(
            [p.micro_batch for p in pred],
            [p.predicted / gib for p in pred],
            marker="x",
            color=color,
            s=60,
            label=f"stage {stage} predicted",
        )
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
    return _write_png(plt, fig, path)


def _write_png(plt, fig, path: Path) -> Path:
    """Save through a new file renamed into place: a link at ``path`` is replaced, never followed."""
    import os

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def plot_timeline(spans: list[Span], path: Path) -> Path:
    """One named row per trial up to MAX_LANES trials; beyond, the trials share MAX_LANES rows
    in turn (unnamed), so the figure's size is bounded however many trials there are."""
    plt = _pyplot()
    lanes = min(len(spans), MAX_LANES)
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.28 * lanes + 1)))
    by_state: dict[str, list[tuple[int, float, float]]] = {}
    for i, s in enumerate(spans):
        by_state.setdefault(s.state, []).append((i % max(lanes, 1), s.start, max(s.end - s.start, 0.5)))
    for state, bars in by_state.items():  # one call per state: fast for thousands of trials
        rows, lefts, widths = zip(*bars)
        ax.barh(rows, widths, left=lefts, color=COLORS.get(state, "#868e96"))
    if len(spans) <= MAX_LANES:
        ax.set_yticks(range(len(spans)), [s.name for s in spans], fontsize=6)
    else:
        ax.set_yticks([])
        ax.set_ylabel(f"{len(spans)} trials, {MAX_LANES} rows in turn")
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first trial")
    ax.set_title("trials by state", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _write_png(plt, fig, path)
