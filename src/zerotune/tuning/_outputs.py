"""Outputs of a tuning: summary.txt, results.json, ds_config_optimal.json (or, where FSDP2 won,
fsdp_config_optimal.json), cmd_optimal.txt."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import write_atomic, write_json
from ..results import TuningResult
from ..trials import UNITS, fmt_value
from ..units import format_size

if TYPE_CHECKING:
    from ..launch import Cluster
    from ..targets import Target


def write_optimal_config(config: dict[str, Any], path: Path) -> Path:
    write_json(path, config)
    return path


def summary_text(result: TuningResult) -> str:
    rows = result.summary_rows()
    head = ["stage", "trials", "ok", "oom", "failed", "pruned", "best " + UNITS[result.metric], "best trial"]
    table = [
        [
            str(r["stage"]),
            str(r["trials"]),
            str(r["ok"]),
            str(r["oom"]),
            str(r["failed"]),
            str(r["pruned"]),
            r["best"],
            r["best_trial"],
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) if table else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    lines.append("")
    if result.best is not None:
        b = result.best
        lines.append(
            f"best: {b.name}  {result.best_figures()}  peak memory {format_size(b.max_peak)} "
            f"per rank (budget {format_size(b.budget)})"
        )
        if line := result.env_line():
            lines.append(line)
    else:
        lines.append("best: none (no trial succeeded)")
    lines += result.engines
    if result.own is not None:
        lines += result.own.lines()
    spent = f"{result.wall_time:.0f} s"
    if result.cost is not None and result.cost.earlier_time:
        spent = f"{result.cost.total_time:.0f} s in all ({result.wall_time:.0f} s in this run)"
    lines.append(f"trials: {len(result.trials)} ({result.launched} run now), tuning time {spent}")
    if result.cost is not None:
        lines += result.cost.lines()
    lines += [f"note: {n}" for n in result.notes]
    lines += result.left_out_lines()
    lines.append("")
    # The figures first, in 80 columns for the usual names; why a trial was not chosen ends the line.
    width = max([len("trial")] + [len(t.name) for t in result.trials]) + 1
    lines.append(
        "trial".ljust(width)
        + "state".ljust(8)
        + UNITS[result.metric].ljust(14)
        + "predicted".ljust(10)
        + "steps".ljust(16)
        + "peak/rank".ljust(11)
        + "why not chosen"
    )
    for t in result.trials:
        predicted = f"{t.predicted:.1f}" if t.predicted is not None else "-"
        lines.append(
            t.name.ljust(width)
            + t.state.value.ljust(8)
            + fmt_value(result.metric, t).ljust(14)
            + predicted.ljust(10)
            + _steps(t).ljust(16)
            + format_size(t.max_peak).ljust(11)
            + result.why_lost(t)
        )
    return "\n".join(lines) + "\n"


def _steps(t) -> str:
    m = t.measurement
    if m is None:
        return "-"
    flag = " stopped early" if m.early_stop else " tied" if m.tied else ("" if m.stable else " capped")
    return f"{m.steps_measured}{flag}"


def write_outputs(result: TuningResult, target: Target, cluster: Cluster, mapped: dict[str, str]) -> None:
    """summary.txt, results.json and, where there is a choice, its ds_config and command (with
    ``mapped``, the script options that carry its batch sizes), then the target's own outputs."""
    root = result.results_dir
    write_atomic(root / "summary.txt", summary_text(result))
    write_json(
        root / "results.json",
        {
            "metric": result.metric,
            "best": result.best.name if result.best else None,
            "trials": [t.to_dict() for t in result.trials],
            "notes": result.notes,
            "own": result.own.to_dict() if result.own is not None else None,
            "engines": result.engines,
        },
    )
    if result.best_config is None:
        return  # the tuning's start removed an earlier choice: none stands beside "best: none"
    form = target if result.best is None or result.best.spec.engine == "deepspeed" else target.fsdp
    assert form is not None, "an FSDP2 trial ran, so the target has an FSDP2 form"
    name = "ds_config_optimal.json" if form is target else form.optimal_file
    optimal = write_optimal_config(result.best_config, root / name)
    command = form.final_command(optimal, result.best_config, mapped, cluster)
    write_atomic(root / "cmd_optimal.txt", command)
    if (batch := cluster.batch_script(command)) is not None:
        write_atomic(root / "sbatch_optimal.sh", batch)
        (root / "sbatch_optimal.sh").chmod(0o755)
    target.after_tuning(result)
