"""The confirmation as a tuning records it: the candidates measured again, their re-measurements
and the figures combined from them. The tuning (tuning.confirm) makes it; ``zerotune show`` and
a resumed tuning read it back from tuning.json."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._errors import ZerotuneError
from ..trials import Measurement, TrialResult, TrialState, t95_df, welch_df
from ._record import read_session


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
    from_trial: str | None = None
    """The candidate whose first-round figure is its own trial: the last one this tuning ran,
    just before, in the same processes (see trial_first). Re-measuring it at once would measure
    the same thing at the same moment again."""
    tie_margin: float | None = None
    """The tie margin the re-measurements settled against (their stop rule and the rounds
    depend on it); None where the record does not say."""


def combined(runs: list[TrialResult]) -> Measurement:
    """The mean of independent re-measurements of one configuration. Its 95% interval comes from
    their standard errors (that of a mean of k estimates: the root sum of squares over k) and
    their degrees of freedom added up (Welch-Satterthwaite): two short rounds together give the
    interval of one window as long as both, not the wider one of each round's own t quantile."""
    ms = [r.measurement for r in runs]
    k = len(ms)
    mean = sum(m.step_time_mean for m in ms) / k
    std = math.sqrt(sum(m.step_time_std**2 for m in ms)) / k
    errors = [m.standard_error for m in ms]
    if all(math.isfinite(se) for se, _ in errors):
        se = math.sqrt(sum(e * e for e, _ in errors)) / k
        df = welch_df([(e * e, d + 1) for e, d in errors])
        ci = t95_df(df) * se
    else:  # a round with one timed step has no interval of its own: the old, wider rule
        ci, df = math.sqrt(sum(m.step_time_ci95**2 for m in ms)) / k, None
    return replace(
        ms[0],
        step_time_mean=mean,
        step_time_ci95=ci if math.isfinite(ci) else mean,
        step_time_std=std,
        step_time_df=df if df is not None and math.isfinite(ci) else None,
        steps_measured=sum(m.steps_measured for m in ms),
        stable=all(m.stable for m in ms),
        timed_seconds=sum(m.timed_seconds for m in ms),
        early_stop=False,
        lost_to=None,
        lost_to_metric="",
        tied=False,
        left_out=[x for m in ms for x in m.left_out],
        left_out_median=next((m.left_out_median for m in ms if m.left_out), None),
    )


def earlier_confirmation(results_dir: Path) -> Confirmation | None:
    """The re-measurements the last finished tuning in ``results_dir`` made (None if unreadable),
    which candidate's first round was its trial, and the tie margin they settled against."""
    try:
        session = read_session(results_dir)
    except ZerotuneError:
        return None
    from_trial = session.get("confirm_from_trial")
    margin = session.get("tie_margin")
    return Confirmation(
        candidates=[],
        runs=remeasured_in(session),
        from_trial=from_trial if isinstance(from_trial, str) else None,
        tie_margin=margin if isinstance(margin, (int, float)) and not isinstance(margin, bool) else None,
    )


def remeasured_in(session: dict) -> list[TrialResult]:
    """The re-measurements a session (tuning.json) records; none where any is damaged."""
    raws = session.get("remeasured")
    try:
        return [TrialResult.from_dict(raw) for raw in raws] if isinstance(raws, list) else []
    except (ValueError, TypeError, KeyError):
        return []  # damaged: measure again (and leave them out of the cost line)


def confirmed_in(session: dict, trials: list[TrialResult]) -> dict[str, TrialResult]:
    """The confirmed figures of a finished tuning read back (``zerotune show``): per candidate,
    its re-measurements that the session (tuning.json) records combined, its trial first where
    that stood as its first-round figure, as the choice read them. Empty where there were none,
    or where a candidate's trial is not among ``trials`` (a damaged folder)."""
    runs = remeasured_in(session)
    first = session.get("confirm_from_trial")
    first = first if isinstance(first, str) else None
    names = list(dict.fromkeys(([first] if first else []) + [r.name for r in runs]))
    by_trial = {t.name: t for t in trials}
    if not runs or any(n not in by_trial for n in names):
        return {}
    group, first = first_in([by_trial[n] for n in names], first)
    _, by_name = start_rounds(group, first)
    for result in runs:
        by_name[result.name].append(result)
    return {c.name: c for c in confirmed_of(by_name, group)}


def first_in(group: list[TrialResult], first: str | None) -> tuple[list[TrialResult], str | None]:
    """``group`` with ``first`` (a candidate's name, or None) moved to the front."""
    if first is None or first not in (r.name for r in group):
        return group, None
    return [r for r in group if r.name == first] + [r for r in group if r.name != first], first


def start_rounds(group: list[TrialResult], first: str | None) -> tuple[Confirmation, dict[str, list[TrialResult]]]:
    """An empty confirmation of ``group``, and its runs by name: for ``first``, its trial."""
    by_name: dict[str, list[TrialResult]] = {r.name: [] for r in group}
    if first is not None:
        by_name[first].append(group[0])  # round 1's figure for it: its trial, just before
    return Confirmation(candidates=[r.name for r in group], from_trial=first), by_name


def confirmed_of(by_name: dict[str, list[TrialResult]], group: list[TrialResult]) -> list[TrialResult]:
    """Per candidate whose every re-measurement so far was OK, its figures combined."""
    out = []
    for r in group:
        runs = by_name[r.name]
        if runs and all(x.state is TrialState.OK and x.measurement is not None for x in runs):
            out.append(replace(r, measurement=combined(runs)))
    return out
