"""A confirmed choice: before the final pick, the configurations within noise of the best (at
most 3) are measured again, interleaved (A B C A B C) in the same warm processes, and the
choice is made on those figures. Interleaving puts the machine's drift (other load, thermal,
a noisy neighbour) on every candidate alike, which separate trials minutes apart cannot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import ZerotuneError
from .ranking import Choice, choose_best, fmt_metric
from .record import read_session
from .trial import Measurement, TrialResult, TrialState

if TYPE_CHECKING:
    from .record import TuningRecord
    from .tuner import Autotuner

MAX_CANDIDATES = 3
ROUNDS = 2
CONFIRM_MAX_SECONDS = 5.0
"""Each re-measurement measures at most this long: two interleaved rounds, not one long window,
are what make the comparison fair, and a tie costs a few seconds per candidate to settle."""


@dataclass(kw_only=True)
class Confirmation:
    candidates: list[str]
    """Names of the configurations measured again, in the order they ran each round."""
    runs: list[TrialResult] = field(default_factory=list)
    """Every re-measurement, in the order it ran."""
    confirmed: dict[str, TrialResult] = field(default_factory=dict)
    """Per candidate, its re-measurements combined (for candidates whose every run was OK)."""
    best: str | None = None
    note: str = ""


def combined(runs: list[TrialResult]) -> Measurement:
    """The mean of independent re-measurements of one configuration, its 95% half-width from
    theirs (the half-width of a mean of k estimates: the root sum of squares over k)."""
    ms = [r.measurement for r in runs]
    k = len(ms)
    mean = sum(m.step_time_mean for m in ms) / k
    ci = math.sqrt(sum(m.step_time_ci95 ** 2 for m in ms)) / k
    std = math.sqrt(sum(m.step_time_std ** 2 for m in ms)) / k
    return replace(ms[0], step_time_mean=mean, step_time_ci95=ci, step_time_std=std,
                   steps_measured=sum(m.steps_measured for m in ms), stable=all(m.stable for m in ms),
                   timed_seconds=sum(m.timed_seconds for m in ms), early_stop=False)


def earlier_remeasurements(results_dir: Path) -> list[TrialResult]:
    """The re-measurements the last finished tuning in ``results_dir`` made (none if unreadable)."""
    try:
        session = read_session(results_dir)
    except ZerotuneError:
        return []
    return remeasured_in(session)


def remeasured_in(session: dict) -> list[TrialResult]:
    """The re-measurements a session (tuning.json) records; none where any is damaged."""
    raws = session.get("remeasured")
    try:
        return [TrialResult.from_dict(raw) for raw in raws] if isinstance(raws, list) else []
    except (ValueError, TypeError, KeyError):
        return []  # damaged: measure again (and leave them out of the cost line)


def confirm(tuner: "Autotuner", record: "TuningRecord", choice: Choice,
            earlier: list[TrialResult] | None = None) -> Confirmation | None:
    """Re-measure ``choice.best`` and its ties (None when it has none); the choice made on the
    re-measured figures is ``best``. ``earlier``: the last tuning's re-measurements, reused when
    this tuning launched nothing (every trial reused: what they measured is unchanged) and they
    re-measured the same candidates, so that a rerun that resumes measures nothing again."""
    metric = tuner.request.autotuning.metric
    if not choice.ties:
        return None
    group = [choice.best] + sorted(choice.ties, key=lambda r: r.metric(metric), reverse=metric != "latency")
    group = group[:MAX_CANDIDATES]
    out = Confirmation(candidates=[r.name for r in group])
    by_name: dict[str, list[TrialResult]] = {r.name: [] for r in group}
    expected = [r.name for _ in range(ROUNDS) for r in group]
    if earlier and record.launched == 0 and [r.name for r in earlier] == expected:
        for i, result in enumerate(earlier):
            out.runs.append(result)
            by_name[result.name].append(result)
            record.emit("confirm", i // len(group) + 1, result.spec, result, "from disk")
        return _decide(out, by_name, group, choice, metric, reused=True)
    for round_ in range(1, ROUNDS + 1):
        for r in group:
            job = tuner.make_confirm_job(record, r.spec, round_)
            result = tuner.launcher.run(job)
            out.runs.append(result)
            by_name[r.name].append(result)
            record.emit("confirm", round_, r.spec, result, f"round {round_} of {ROUNDS}")
    return _decide(out, by_name, group, choice, metric, reused=False)


def _decide(out: Confirmation, by_name: dict[str, list[TrialResult]], group: list[TrialResult], choice: Choice,
            metric: str, *, reused: bool) -> Confirmation:
    for r in group:
        runs = by_name[r.name]
        if all(x.state is TrialState.OK and x.measurement is not None for x in runs):
            out.confirmed[r.name] = replace(r, measurement=combined(runs))
    pick = choose_best(list(out.confirmed.values()), metric)
    if pick is None:
        out.note = "re-measuring the configurations within noise failed; the choice stands as first measured"
        return out
    out.best = pick.best.name
    figures = ", ".join(f"{name} {fmt_metric(metric, c)}" for name, c in out.confirmed.items())
    failed = [n for n in out.candidates if n not in out.confirmed]
    order = " ".join("ABC"[:len(group)] * ROUNDS)
    verdict = pick.note or f"chose {out.best}; the others are slower beyond noise"
    if out.best != choice.best.name:
        verdict += f" (on the first measurements: {choice.best.name})"
    out.note = (f"confirmed: re-measured {len(group)} configurations within noise of each other, interleaved "
                + ("(by an earlier run of this tuning, reused) " if reused else "") +
                f"({order}): {figures}; {verdict}"
                + (f"; re-measuring failed for {', '.join(failed)}" if failed else ""))
    return out
