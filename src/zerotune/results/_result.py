"""What a tuning produced: the best trial and config, every trial, and why each lost."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ZerotuneError
from ..request import config_file
from ..trials import (
    MAXIMIZE,
    MEASURE_DEFAULTS,
    UNITS,
    Choice,
    TrialResult,
    TrialSpec,
    TrialState,
    better,
    choose_best,
    fmt_metric,
    fmt_number,
    fmt_value,
    shown_worse,
    tied_with,
)
from ._confirmed import confirmed_in, remeasured_in
from ._cost import TuningCost, tuning_cost
from ._folder import busy, expand
from ._own_config import OwnConfig, compare_with_own
from ._record import read_session
from ._store import SESSION, DamagedTrial, ResultStore


@dataclass(kw_only=True)
class TuningResult:
    metric: str
    trials: list[TrialResult]
    best: TrialResult | None
    best_config: dict[str, Any] | None
    results_dir: Path
    notes: list[str] = field(default_factory=list)
    wall_time: float = 0.0
    launched: int = 0
    """Trials actually run in this invocation (not reused from disk, not pruned)."""
    cost: TuningCost | None = None
    """Where the tuning's time went."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the trials ran with that their figures depend on (CPU: OMP_NUM_THREADS)."""
    confirmed: dict[str, TrialResult] = field(default_factory=dict)
    """Per configuration measured again before the choice (see tuning.confirm), its re-measurements
    combined: the figures the choice was made on, minutes after the trial's own."""
    state: str = "finished"
    """finished; running (a tuning holds the folder now, ``pid``); interrupted (it ended before
    its choice: stopped, or killed; a rerun resumes)."""
    pid: int | None = None
    """The process of the tuning that wrote the record."""
    tie_margin: float = MEASURE_DEFAULTS.tie_margin
    """How much speed memory headroom could cost in the choice (MeasureSettings.tie_margin)."""
    own: OwnConfig | None = None
    """The user's own configuration against the choice: its figure, the speed-up over it and
    when the tuning pays back (None where the config names none)."""
    engines: list[str] = field(default_factory=list)
    """Per engine of a tuning across engines: its best configuration, figure, peak memory and
    dtypes, and why it lost or was not ranked (empty for one engine)."""

    def state_line(self) -> str | None:
        """What a reader of an unfinished tuning is told instead of its choice."""
        done = sum(t.state is not TrialState.PRUNED for t in self.trials)
        if self.state == "running":
            who = f" (pid {self.pid})" if self.pid else ""
            return f"in progress: a tuning{who} is running in this folder; {done} trial(s) finished so far"
        if self.state == "interrupted":
            return (
                f"interrupted after {done} trial(s); rerun the same tuning command to resume (finished trials "
                "are reused)"
            )
        return None

    def outputs(self) -> list[str]:
        """The output files of the folder that exist (an interrupted tuning has none)."""
        names = ("summary.txt", "ds_config_optimal.json", "fsdp_config_optimal.json", "cmd_optimal.txt")
        return [n for n in names if (Path(self.results_dir) / n).is_file()]

    def figure(self, trial: TrialResult) -> TrialResult:
        """``trial`` with the figures the choice read: its confirmed ones where it was measured
        again, else its own."""
        return self.confirmed.get(trial.name, trial)

    def best_figures(self) -> str:
        """The choice's metric with its interval, as the choice read it, and its trial's where the
        confirmation measured it again ("44.1 ± 0.5 samples/s re-measured (trial 41.0 ± 0.2)")."""
        assert self.best is not None
        figure, trial = self.figure(self.best), fmt_value(self.metric, self.best)
        if fmt_value(self.metric, figure) == trial:
            # Not measured again, or its trial stood as its only figure (see tuning.confirm.trial_first).
            return fmt_metric(self.metric, figure)
        return f"{fmt_metric(self.metric, figure)} re-measured (trial {trial})"

    def env_line(self) -> str | None:
        """The environment named beside the choice: its figures hold only with it."""
        if not self.env:
            return None
        words = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"environment: {words} (every trial ran with it, the figures hold with it; cmd_optimal.txt sets it)"

    @property
    def best_metric(self) -> tuple[float, float] | None:
        """The best trial's metric and the half-width of its 95% interval."""
        if self.best is None:
            return None
        best = self.figure(self.best)
        return best.metric(self.metric), best.metric_ci(self.metric) or 0.0

    def why_lost(self, trial: TrialResult) -> str:
        """One line on why ``trial`` is not the choice."""
        if self.best is None:
            return trial.reason or trial.state.value
        mine = "your config; " if self.own is not None and trial.name == self.own.name else ""
        return mine + self._why_lost(trial)

    def _why_lost(self, trial: TrialResult) -> str:
        assert self.best is not None
        if trial is self.best or trial.name == self.best.name:
            return "chosen"
        if trial.state is not TrialState.OK:
            return f"{trial.state.value}: {trial.reason}"
        # Both measured again side by side: those figures decided, never one of each moment.
        again = trial.name in self.confirmed and self.best.name in self.confirmed
        r, best = (self.confirmed[trial.name], self.confirmed[self.best.name]) if again else (trial, self.best)
        how = "re-measured: " if again else ""
        if tied_with(self.metric, r, best):
            if (best.max_peak or 0) < (r.max_peak or 0) and better(
                self.metric, r.metric(self.metric), best.metric(self.metric)
            ):
                return f"{how}within noise of {best.name}, which has more memory headroom"
            return f"{how}within noise of {best.name}, which measured better; the order is not certain"
        v, b = r.metric(self.metric), best.metric(self.metric)
        pct = abs(b - v) / b * 100 if b else 0.0
        line = f"{how}{pct:.1f}% {'slower' if MAXIMIZE[self.metric] else 'higher latency'} than {best.name}"
        if shown_worse(self.metric, r, best):
            # Its few steps may leave it inside the two-sided noise: what decided is the probe's test.
            lost_to = fmt_number(self.metric, r.measurement.lost_to)
            line += f" (stopped early: shown, one-sided at 95%, unable to beat {lost_to} {UNITS[self.metric]})"
        return line

    def left_out_lines(self) -> list[str]:
        """One line per measurement that left a disturbed step out of its figure (see
        step_stats.split_disturbed): a trial's, and its re-measurements' where the confirmation
        measured it again. Said, because the figure is then of the other steps."""
        lines = []
        measured = [(t.name, t) for t in self.trials] + [(f"{n} re-measured", c) for n, c in self.confirmed.items()]
        for label, t in measured:
            m = t.measurement
            if m is None or not m.left_out:
                continue
            unit = "micro-step" if m.left_out_unit == "micro-step" else "step"
            seconds = ", ".join(f"{x:.2f}" for x in sorted(m.left_out, reverse=True)[:3])
            more = ", ..." if len(m.left_out) > 3 else ""
            median = f"; their median {m.left_out_median:.2f} s" if m.left_out_median else ""
            lines.append(
                f"left out: {label}: {len(m.left_out)} {unit}{'s' * (len(m.left_out) > 1)} "
                f"({seconds}{more} s{median}) far slower than the rest, as a disturbance of the machine; "
                "its figure is of the other steps"
            )
        return lines

    def summary_rows(self) -> list[dict[str, Any]]:
        """Per stage (per engine and stage, "ZeRO-2" or "FSDP2 keep", where FSDP2 ran too):
        trials, best metric with its spread, best trial."""
        rows = []
        both = any(t.spec.engine != "deepspeed" for t in self.trials)
        for engine, stage in sorted({(t.spec.engine, t.spec.stage) for t in self.trials}):
            trials = [t for t in self.trials if (t.spec.engine, t.spec.stage) == (engine, stage)]
            choice = choose_best(trials, self.metric, self.tie_margin)
            states = {s: sum(t.state is s for t in trials) for s in TrialState}
            rows.append(
                {
                    "stage": trials[0].spec.setting if both else stage,
                    "trials": len(trials),
                    "ok": states[TrialState.OK],
                    "oom": states[TrialState.OOM],
                    "failed": states[TrialState.CRASHED] + states[TrialState.TIMEOUT] + states[TrialState.KILLED],
                    "pruned": states[TrialState.PRUNED],
                    "best": fmt_value(self.metric, choice.best) if choice else "-",
                    "best_trial": choice.best.name if choice else "-",
                }
            )
        return rows


FIXES = {
    TrialState.OOM: "lower min_train_micro_batch_size_per_gpu or raise --memory-per-device",
    TrialState.TIMEOUT: "raise --trial-timeout or --stall-timeout, or make the script reach its first steps sooner",
    TrialState.CRASHED: "fix the error shown (the trial's rank*.stderr has it)",
    TrialState.KILLED: "rerun: a kill from outside says nothing of the configuration",
    TrialState.PRUNED: "raise --memory-per-device or lower min_train_micro_batch_size_per_gpu (the memory model "
    "predicted none to fit)",
}
"""Per way a trial ends, what lets a tuning where no trial succeeded find a configuration."""


def no_choice_message(trials: list[TrialResult], results_dir: Path, time_budget: float | None) -> str:
    """Why a tuning ended without a choice: each trial's end (the last few), and the fix of each
    kind of end seen; where no trial ran, what stopped them."""
    if not trials:
        if time_budget is not None:
            return (
                f"no trial ran: the time budget of {time_budget:g} s was spent before the first one could "
                "start; raise --time-budget"
            )
        return "no trial ran: the search found no configuration to try; widen the micro-batch bounds or stages"
    shown = "; ".join(f"{t.name}: {t.state.value} ({t.reason})" for t in trials[-3:])
    fixes = [FIXES[s] for s in dict.fromkeys(t.state for t in trials) if s in FIXES]
    return f"no configuration ran successfully: {shown}. Trial logs are in {results_dir}; " + "; ".join(
        dict.fromkeys(fixes)
    )


def load_results(results_dir: str | Path) -> TuningResult:
    """The result of a finished, running or interrupted tuning, read from disk without running
    anything: the trials its record (tuning.json) lists, never others an earlier tuning left in
    the folder.

    Args:
        results_dir: The tuning's results folder (``~`` and ``$VARS`` expanded).

    Returns:
        A :class:`TuningResult` whose ``state`` says whether the tuning finished; a trial whose
        result is damaged is named in its notes.

    Raises:
        ZerotuneError: The folder holds no zerotune record, or the record is damaged.
    """
    root = expand(results_dir)
    session = read_session(root)
    names, metric = session.get("trials"), session.get("metric", "throughput")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or metric not in MAXIMIZE:
        raise ZerotuneError(
            f"{root / SESSION} is damaged (no list of trials, or an unknown metric); rerun the "
            "tuning command to rebuild it (finished trials are reused)"
        )
    store = ResultStore(root, create=False)
    trials, damaged = [], []
    for name in names:
        try:
            if not name or "/" in name or name.startswith("."):
                raise DamagedTrial(name, "its name is not a trial folder's")
            trials.append(store.load(name))
        except DamagedTrial as e:
            damaged.append(str(e))
    margin = session.get("tie_margin")
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 <= margin <= 0.5:
        margin = MEASURE_DEFAULTS.tie_margin  # an older record, or a damaged value
    choice = choose_best(trials, metric, margin)
    named = next((t for t in trials if t.name == session.get("best") and t.state is TrialState.OK), None)
    if choice is not None and named is not None and named is not choice.best:
        # The finished tuning confirmed its choice by re-measuring the ties (see tuning.confirm).
        choice = Choice(named, [t for t in choice.ties + [choice.best] if t is not named], "")
    remeasured = remeasured_in(session)
    best_config = None
    if choice is not None:
        saved = session.get("best_config")
        if session.get("best") == choice.best.name and isinstance(saved, dict):
            best_config = saved
        else:
            try:
                file = config_file(choice.best.spec)
                best_config = json.loads((root / choice.best.name / file).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                damaged.append(f"trial {choice.best.name}: its {file} is missing or damaged")
            if not isinstance(best_config, dict):
                best_config = None
    notes = (
        [n for n in session.get("notes", []) if isinstance(n, str)] if isinstance(session.get("notes"), list) else []
    )
    # Seconds as an earlier run wrote them; anything else (a hand-edited or damaged file) reads 0.
    wall, earlier = (
        float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf else 0.0
        for v in (session.get("wall_time"), session.get("earlier_time"))
    )
    try:
        own = TrialSpec.from_dict(session["own"]) if session.get("own") is not None else None
    except ValueError:
        own = None
    best = choice.best if choice else None
    env = session.get("env")
    env = {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(env, dict) else {}
    confirmed = confirmed_in(session, trials) if best is not None and best.name == session.get("best") else {}
    state = session.get("state") if session.get("state") in ("finished", "running", "interrupted") else "finished"
    if state == "running" and not busy(root):
        state = "interrupted"  # its tuner was killed: nothing holds the folder
    pid = (
        session.get("pid") if isinstance(session.get("pid"), int) and not isinstance(session.get("pid"), bool) else None
    )
    return TuningResult(
        metric=metric,
        trials=trials,
        best=best,
        best_config=best_config,
        results_dir=root,
        env=env,
        confirmed=confirmed,
        state=state,
        pid=pid,
        tie_margin=margin,
        notes=notes + damaged + ([choice.note] if choice and choice.note and choice.note not in notes else []),
        wall_time=wall,
        cost=(cost := tuning_cost(trials, wall, remeasured=remeasured, earlier_time=earlier)),
        own=compare_with_own(trials, best, own, confirmed, metric, max(cost.total_time, cost.trial_time)),
    )
