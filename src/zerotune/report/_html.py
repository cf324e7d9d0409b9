"""``zerotune report RESULTS_DIR``: one self-contained report.html (figures embedded) plus the
figures as PNG files, from what a finished or interrupted tuning left on disk.

Every string that came from the user or a trial (names, reasons, config values, paths) is
HTML-escaped; the page loads nothing from anywhere.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from .._files import write_atomic
from ..results import load_results, read_session
from ..trials import fmt_metric
from ..units import format_size
from . import _figures as rf

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:960px;color:#212529}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #dee2e6;padding:3px 8px;
text-align:left}th{background:#f1f3f5}.ok{color:#2b8a3e}.oom{color:#e8590c}.pruned{color:#1c7ed6}
.crashed,.timeout{color:#c92a2a}figure{margin:1.5em 0}img{max-width:100%}code{background:#f1f3f5;padding:1px 4px}"""


def _user_config(session: dict[str, Any]) -> dict[str, Any]:
    if isinstance(session.get("user_config"), dict):
        return session["user_config"]
    args = session.get("args")
    args = [a for a in args if isinstance(a, str)] if isinstance(args, list) else []
    for flag in ("--deepspeed_config", "--deepspeed"):
        if flag in args and args.index(flag) + 1 < len(args):
            try:
                config = json.loads(Path(args[args.index(flag) + 1]).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
            return config if isinstance(config, dict) else {}
    return {}


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()  # read back from a folder just made, not a link
    return f'<figure><img id="{path.stem}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _table(header: list[str], rows: list[list[Any]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        f'<tr class="{html.escape(classes[i]) if classes else ""}">'
        + "".join(f"<td>{html.escape('' if v is None else str(v))}</td>" for v in row)
        + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 2**20 else 1


def write_report(results_dir: str | Path) -> Path:
    """Writes ``report.html`` and ``report/*.png`` in ``results_dir``; returns the page's path.
    Nothing is written through a link: a ``report`` link or file in the folder is replaced."""
    from ..results import expand

    root = expand(results_dir)
    result = load_results(root)
    session = read_session(root)
    dp = _count(session.get("num_gpus")) * _count(session.get("num_nodes"))
    budget = session.get("budget") if isinstance(session.get("budget"), int) and session["budget"] > 0 else None
    figs = root / "report"
    if figs.is_symlink() or (figs.exists() and not figs.is_dir()):
        figs.unlink()
    figs.mkdir(exist_ok=True)
    throughput = rf.throughput_data(result.trials, result.metric)
    memory = rf.memory_data(result.trials, dp)
    spans = rf.timeline_data(result.trials, root)
    images = [
        _img(
            rf.plot_throughput(throughput, result.metric, figs / "throughput.png"),
            f"{result.metric} versus micro-batch per configuration, with 95% intervals",
        ),
        _img(
            rf.plot_memory(memory, budget, figs / "memory.png"),
            "peak memory per rank, measured and predicted, with the budget",
        ),
        _img(rf.plot_timeline(spans, figs / "timeline.png"), "when each trial ran, by state"),
    ]
    best = result.best
    diff = rf.config_diff(_user_config(session), result.best_config or {})
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>zerotune report</title><style>{STYLE}</style>"
        "</head><body>",
        f"<h1>zerotune report</h1><p>{html.escape(str(session.get('script', '')))} "
        f"{html.escape(' '.join(map(str, session.get('args', []))))}</p>",
        f"<p>state: <b>{html.escape(str(session.get('state', '?')))}</b>, {len(result.trials)} trials, "
        f"budget {html.escape(format_size(budget) if budget else 'none')} per device, "
        f"{html.escape(str(session.get('device', '')))}</p>",
        (
            "<h2>Chosen</h2><p id='best'><b>"
            + html.escape(best.name)
            + "</b> "
            + html.escape(result.best_figures())
            + f", peak {html.escape(format_size(best.max_peak))}"
            + " per rank</p>"
        )
        if best
        else "<h2>Chosen</h2><p id='best'>no configuration ran successfully</p>",
        "<h3>Against your config</h3>"
        + (
            "<p id='own'>" + "<br>".join(html.escape(line) for line in result.own.lines()) + "</p>"
            if result.own is not None
            else ""
        )
        + (_table(["key", "yours", "chosen"], [list(d) for d in diff]) if diff else "<p>no difference</p>"),
        "<h2>Throughput</h2>" + images[0],
        "<h2>Memory</h2>" + images[1],
        "<h2>Timeline</h2>" + images[2],
        "<h2>Trials</h2>"
        + _table(
            ["trial", "state", result.metric, "predicted", "peak/rank", "processes", "why"],
            [
                [
                    t.name,
                    t.state.value,
                    fmt_metric(result.metric, t) if t.state.value == "ok" else "",
                    f"{t.predicted:.1f} samples/s" if t.predicted is not None else "",
                    format_size(t.max_peak) if t.max_peak else "",
                    t.start + (f"; then retired: {t.retired}" if t.retired else ""),
                    result.why_lost(t),
                ]
                for t in result.trials
            ],
            [t.state.value for t in result.trials],
        ),
        "<h2>Notes</h2><ul>"
        + "".join(f"<li>{html.escape(n)}</li>" for n in result.notes + result.left_out_lines())
        + "</ul>",
        "</body></html>",
    ]
    page = root / "report.html"
    write_atomic(page, "\n".join(parts))
    return page
