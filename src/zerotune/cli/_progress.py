"""Watching a tuning: a live status line over one line per event (rich), or one JSON object per
event for machines. Both read only :class:`~zerotune.TuningEvent`s; the core never prints."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..trials import fmt_metric
from ..units import format_size
from ._terminal_text import safe

FAILED = {"crashed", "timeout", "killed"}


class ProgressState:
    """What the events have told so far: counts, running trials, the best, durations."""

    def __init__(self, metric: str = "throughput", slots: int = 1, time_budget: float | None = None):
        self.metric, self.slots, self.time_budget = metric, slots, time_budget
        self.start = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.running: dict[str, float] = {}
        """Trial name -> when it started (monotonic)."""
        self.durations: list[float] = []
        self.launched = 0
        self.max_trials = 0
        self.best = None

    def update(self, event) -> None:
        self.max_trials = event.max_trials or self.max_trials
        if event.kind == "started":
            self.running[event.spec.name] = time.monotonic()
            self.launched += 1
        elif event.kind in ("finished", "reused", "pruned"):
            r = event.result
            if event.kind == "finished":
                began = self.running.pop(r.name, None)
                self.durations.append(time.monotonic() - began if began is not None else r.wall_time)
            state = r.state.value
            self.counts["failed" if state in FAILED else state] += 1
        elif event.kind == "best":
            self.best = event.result

    def time_left(self) -> float | None:
        """At most this many seconds left: the trials the cap still allows at the mean trial
        time, over the slots, bounded by the time budget. None before any trial finished."""
        if not self.durations:
            return None
        mean = sum(self.durations) / len(self.durations)
        left = (
            max(0, self.max_trials - self.launched) * mean / self.slots
            + sum(max(0.0, mean - (time.monotonic() - t)) for t in self.running.values()) / self.slots
        )
        if self.time_budget is not None:
            left = min(left, max(0.0, self.time_budget - (time.monotonic() - self.start)) + mean)
        return left

    def status(self) -> str:
        """Two lines: where the tuning stands, then what runs and what leads (a narrow terminal
        crops the second, never the first)."""
        now = time.monotonic()
        head = [
            f"trial {self.launched} of at most {self.max_trials}",
            " ".join(f"{k} {self.counts[k]}" for k in ("ok", "oom", "pruned", "failed")),
        ]
        left = self.time_left()
        if left is not None:
            head.append(f"at most {_duration(left)} left")
        tail = []
        if self.running:
            tail.append("running " + ", ".join(f"{n} ({now - t:.0f} s)" for n, t in self.running.items()))
        if self.best is not None:
            tail.append(f"best {self.best.name} {fmt_metric(self.metric, self.best)}")
        return " | ".join(head) + ("\n" + " | ".join(tail) if tail else "")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


class ProgressPrinter:
    """One line per event, and (on a terminal) a live status line under them."""

    def __init__(self, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self.state = ProgressState()
        self._live: Live | None = None

    @property
    def metric(self) -> str:
        return self.state.metric

    @metric.setter
    def metric(self, value: str) -> None:
        self.state.metric = value

    def watch(self, tuner) -> ProgressPrinter:
        self.state = ProgressState(tuner.request.autotuning.metric, len(tuner.slots), tuner.time_budget)
        return self

    def __enter__(self) -> ProgressPrinter:
        if not self.quiet and self.console.is_terminal:
            self._live = Live(
                get_renderable=lambda: Text(self.state.status(), style="dim"),
                console=self.console,
                refresh_per_second=2,
                transient=True,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def __call__(self, event) -> None:
        self.state.update(event)
        if self.quiet:
            return
        n = event.index + 1
        # Names, reasons and notes carry text from the script and the config: never markup.
        if event.kind == "started":
            self.console.print(f"[dim]trial {n}[/] {safe(event.spec.name)} ...")
        elif event.kind in ("finished", "reused"):
            r = event.result
            tag = " (from disk)" if event.kind == "reused" else f" {r.wall_time:.0f} s"
            value = fmt_metric(self.metric, r) if r.state.value == "ok" else r.reason
            color = "green" if r.state.value == "ok" else "yellow"
            self.console.print(
                f"[dim]trial {n}[/] {safe(r.name)} [{color}]{r.state.value}[/] {safe(value)}  "
                f"peak {format_size(r.max_peak)}{tag}"
            )
        elif event.kind == "pruned":
            self.console.print(f"[dim]trial {n}[/] {safe(event.spec.name)} [blue]pruned[/] {safe(event.message)}")
        elif event.kind == "confirm":
            r = event.result
            value = fmt_metric(self.metric, r) if r.state.value == "ok" else r.reason
            self.console.print(
                f"[dim]confirm[/] {safe(r.name)} {r.state.value} {safe(value)}  "
                f"({safe(event.message)}, {r.wall_time:.0f} s)"
            )
        elif event.kind == "best":
            self.console.print(f"  [bold]best so far:[/] {safe(event.result.name)}")
        elif event.kind == "note":
            self.console.print(f"  [dim]{safe(event.message)}[/]")


class JsonEvents:
    """``--log-format json``: one JSON object per line and event, on stdout."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream or sys.stdout
        self.state = ProgressState()
        self.metric = "throughput"

    def watch(self, tuner) -> JsonEvents:
        self.metric = tuner.request.autotuning.metric
        self.state = ProgressState(self.metric, len(tuner.slots), tuner.time_budget)
        return self

    def __enter__(self) -> JsonEvents:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __call__(self, event) -> None:
        self.state.update(event)
        out: dict[str, Any] = {
            "event": event.kind,
            "time": round(time.time(), 3),
            "index": event.index,
            "max_trials": event.max_trials,
        }
        if event.spec is not None:
            out.update(trial=event.spec.name, config=event.spec.to_dict())
        r = event.result
        if r is not None:
            out.update(
                trial=r.name,
                state=r.state.value,
                reason=r.reason,
                peak_memory=r.max_peak,
                wall_time=round(r.wall_time, 3),
            )
            if r.metric(self.metric) is not None:
                out.update(metric=self.metric, value=r.metric(self.metric), ci95=r.metric_ci(self.metric))
        if event.message:
            out["message"] = event.message
        out["counts"] = dict(self.state.counts)
        self.stream.write(json.dumps(out) + "\n")
        self.stream.flush()

    def result(self, result) -> None:
        """The last line: the outcome."""
        best = result.best
        self.stream.write(
            json.dumps(
                {
                    "event": "result",
                    "best": best.name if best else None,
                    "value": result.best_metric[0] if best else None,
                    "metric": result.metric,
                    "results_dir": str(result.results_dir),
                    "notes": result.notes,
                    "env": result.env,
                    "cost": result.cost.to_dict() if result.cost is not None else None,
                    "own": result.own.to_dict() if result.own is not None else None,
                }
            )
            + "\n"
        )
        self.stream.flush()
