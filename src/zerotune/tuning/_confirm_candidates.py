"""Which configurations the confirmation (tuning.confirm) measures again: the pick and the trials
within noise of it, at most MAX_CANDIDATES, and where the pick's own figure never settled, the
best trial stopped early against that figure.

An early stop is a one-sided two-sample test of a trial's few steps against the leader's figure
and its standard error; it assumes each measurement's noise is its steps' own. A machine's drift
between two windows is not: a cold first trial capped at its time limit without settling (a
wide interval) can stop a config early that, measured interleaved, is the faster. Against a
leader that settled the test's answer stands (the interval it compared with is the leader's true
one); against one that did not, the loser nearest to it is measured again beside it, which is
what the interleaved rounds are for. It joins only where its figure lies inside the leader's own
interval and where it could still be the choice (inside the pick's
interval or within DRIFT of it, see near_pick, when it was stopped against a tie), and only one
does: a capped leader is common in a noisy hour, and each candidate costs a re-measurement or two.

A settled figure is true of its own window only. Where other trials ran between the leader's and
the loser's, the machine's drift over that time is in neither interval (a shared host's speed
can move 15-20% within minutes), and a loser stopped against a figure from a faster stretch may
be the faster side by side. Such a loser joins too where it is within DRIFT of the pick.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trials import MAXIMIZE, Choice, TrialResult, TrialState, tied_with

MAX_CANDIDATES = 3
DRIFT = 0.07
"""How far behind the pick a loser stopped early against a figure from trials before may be and
still join: wide enough for the gaps a drift between windows reverses (about 6%), narrow enough
that a loser 9-10% behind, which side by side measures as far behind, costs no re-measurement
(tests/test_confirm_candidates.py holds the cases)."""


@dataclass(kw_only=True)
class Candidates:
    group: list[TrialResult]
    """What is measured again: the pick first, then by their trial's figure, best first."""
    doubted: TrialResult | None = None
    """The trial stopped early against an unsettled figure that joined, if any."""
    against: TrialResult | None = None
    """The trial whose figure ``doubted`` was stopped against."""
    why: str = ""
    """Why that figure is in doubt: it never settled, or it was measured trials before."""

    def note(self) -> str:
        """Why ``doubted`` is measured again ("" where none joined)."""
        if self.doubted is None or self.against is None:
            return ""
        return f"{self.doubted.name} joined: it was stopped early against {self.against.name}'s figure, {self.why}"


def candidates(choice: Choice, trials: list[TrialResult], metric: str, own: TrialResult | None = None) -> Candidates:
    """The configurations the confirmation of ``choice`` measures again (see the module's doc);
    a group of one (the pick alone) needs no confirmation. ``own``, the trial of the user's
    config, joins whenever it is within noise of the pick, beyond MAX_CANDIDATES: the speed-up
    over it is then read from figures measured side by side."""
    doubted, against, why = doubted_loser(choice, trials, metric)
    others = choice.ties + ([doubted] if doubted is not None else [])
    group = [choice.best] + sorted(others, key=lambda r: r.metric(metric), reverse=MAXIMIZE[metric])
    group = group[:MAX_CANDIDATES]
    if not any(r is doubted for r in group):
        doubted = against = None
        why = ""
    if own is not None and own.state is TrialState.OK and all(r.name != own.name for r in group):
        if tied_with(metric, own, choice.best):
            group.append(own)
    return Candidates(group=group, doubted=doubted, against=against, why=why)


def inside_interval(metric: str, r: TrialResult, against: TrialResult) -> bool:
    """``r``'s figure lies inside the 95% interval of ``against``'s: that figure alone cannot tell
    the two apart, and the early stop that parted them trusted it. Two-sided noise of both (its
    hypotenuse) would let in a loser beyond the leader's interval but inside its own wide
    two-step one, which measured again is as far behind."""
    v, lead, ci = r.metric(metric), against.metric(metric), against.metric_ci(metric)
    return v is not None and lead is not None and ci is not None and abs(lead - v) <= ci


def near_pick(metric: str, r: TrialResult, pick: TrialResult) -> bool:
    """``r`` could still be the choice: its figure lies inside the pick's interval, or within
    DRIFT of it. An early stop against a tie's unsettled figure is in doubt against that tie, but
    the choice is the pick's to lose: a loser far behind the pick would cost a re-measurement that
    cannot change the choice. Where the figure it was stopped against is the pick's, inside
    that interval is inside the pick's (the case the rule is for)."""
    return inside_interval(metric, r, pick) or within_drift(metric, r, pick)


def within_drift(metric: str, r: TrialResult, pick: TrialResult) -> bool:
    """``r``'s figure is within DRIFT of the pick's."""
    v, lead = r.metric(metric), pick.metric(metric)
    return v is not None and lead is not None and abs(lead - v) <= DRIFT * abs(lead)


def unsettled(r: TrialResult) -> bool:
    """``r`` measured to its end (its time cap, or the script's) without its interval settling."""
    m = r.measurement
    return r.state is TrialState.OK and m is not None and not m.stable and not m.early_stop


def ran_between(trials: list[TrialResult], a: TrialResult, b: TrialResult) -> int:
    """How many trials ran (any end but pruned) between ``a`` and ``b`` in ``trials``' order (0
    where either is not among them)."""
    names = [t.name for t in trials]
    if a.name not in names or b.name not in names:
        return 0
    i, j = sorted((names.index(a.name), names.index(b.name)))
    return sum(t.state is not TrialState.PRUNED for t in trials[i + 1 : j])


def doubted_loser(
    choice: Choice, trials: list[TrialResult], metric: str
) -> tuple[TrialResult, TrialResult, str] | tuple[None, None, str]:
    """The best trial stopped early against the figure of the pick or one of its ties where that
    figure is in doubt (see the module's doc), with the trial it was stopped against and why;
    (None, None, "") where there is none."""
    leaders = [choice.best] + choice.ties
    names = {r.name for r in leaders}
    found: list[tuple[TrialResult, TrialResult, str]] = []
    for r in trials:
        m = r.measurement
        if (
            r.name in names
            or r.state is not TrialState.OK
            or m is None
            or not m.early_stop
            or m.lost_to is None
            or m.lost_to_metric != metric
            or r.metric(metric) is None
        ):
            continue
        against = next((x for x in leaders if x.metric(metric) == m.lost_to), None)
        if against is None or against.metric(metric) is None:
            continue
        if unsettled(against) and inside_interval(metric, r, against) and near_pick(metric, r, choice.best):
            ma = against.measurement
            assert ma is not None, "an unsettled figure is a measured one"
            found.append(
                (r, against, f"which never settled (±{ma.step_time_ci95 / ma.step_time_mean:.0%} at its time cap)")
            )
        elif (between := ran_between(trials, r, against)) and within_drift(metric, r, choice.best):
            found.append(
                (
                    r,
                    against,
                    f"measured {between} trial(s) before it (the machine's drift over that "
                    f"time is in neither interval), and it is within {DRIFT:.0%} of "
                    f"{choice.best.name}'s",
                )
            )
    if not found:
        return None, None, ""
    return max(found, key=lambda f: f[0].metric(metric) * (1 if MAXIMIZE[metric] else -1))
