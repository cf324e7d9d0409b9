"""Which configurations the confirmation (confirm.py) measures again: the pick and the trials
within noise of it, at most MAX_CANDIDATES, and where the pick's own figure never settled, the
best trial stopped early against that figure.

An early stop is a one-sided two-sample test of a trial's few steps against the leader's figure
and its standard error; it assumes each measurement's noise is its steps' own. A machine's drift
between two windows is not: in one bench run a cold first trial led at 27.4 ± 3.0 samples/s,
capped at its time limit without settling (±11%), and the next config, stopped early after two
steps at 25.0 ± 1.8, then led in six of eight interleaved rounds by 2-18%. Against a leader
that settled the test's answer stands (the interval it compared with is the leader's true
one); against one that did not, the loser nearest to it is measured again beside it, which is
what the interleaved rounds are for. It joins only where its figure lies inside the leader's own
interval (25.0 inside 27.4 ± 3.0 there), and only one does: a capped leader is common in a noisy
hour, and each candidate costs a re-measurement or two.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ranking import MAXIMIZE, Choice
from .trial import TrialResult, TrialState

MAX_CANDIDATES = 3


@dataclass(kw_only=True)
class Candidates:
    group: list[TrialResult]
    """What is measured again: the pick first, then by their trial's figure, best first."""
    doubted: TrialResult | None = None
    """The trial stopped early against an unsettled figure that joined, if any."""
    against: TrialResult | None = None
    """The trial whose unsettled figure ``doubted`` was stopped against."""

    def note(self) -> str:
        """Why ``doubted`` is measured again ("" where none joined)."""
        if self.doubted is None or self.against is None:
            return ""
        m = self.against.measurement
        assert m is not None, "an unsettled figure is a measured one"
        return (f"{self.doubted.name} joined: it was stopped early against {self.against.name}'s figure, "
                f"which never settled (±{m.step_time_ci95 / m.step_time_mean:.0%} at its time cap)")


def candidates(choice: Choice, trials: list[TrialResult], metric: str) -> Candidates:
    """The configurations the confirmation of ``choice`` measures again (see the module's doc);
    a group of one (the pick alone) needs no confirmation."""
    doubted, against = doubted_loser(choice, trials, metric)
    others = choice.ties + ([doubted] if doubted is not None else [])
    group = ([choice.best] + sorted(others, key=lambda r: r.metric(metric), reverse=MAXIMIZE[metric]))
    group = group[:MAX_CANDIDATES]
    if not any(r is doubted for r in group):
        doubted = against = None
    return Candidates(group=group, doubted=doubted, against=against)


def inside_interval(metric: str, r: TrialResult, against: TrialResult) -> bool:
    """``r``'s figure lies inside the 95% interval of ``against``'s: that figure alone cannot tell
    the two apart, and the early stop that parted them trusted it. Two-sided noise of both (its
    hypotenuse) let in a loser beyond the leader's interval but inside its own two-step one: in
    run 31-1, 30.1 samples/s against 32.0 ± 1.6, measured again at 23% slower for nothing."""
    v, lead, ci = r.metric(metric), against.metric(metric), against.metric_ci(metric)
    return v is not None and lead is not None and ci is not None and abs(lead - v) <= ci


def unsettled(r: TrialResult) -> bool:
    """``r`` measured to its end (its time cap, or the script's) without its interval settling."""
    m = r.measurement
    return r.state is TrialState.OK and m is not None and not m.stable and not m.early_stop


def doubted_loser(choice: Choice, trials: list[TrialResult],
                  metric: str) -> tuple[TrialResult, TrialResult] | tuple[None, None]:
    """The best trial stopped early against the figure of the pick or one of its ties where that
    figure never settled, and inside that figure's own interval, with the trial it was stopped
    against; (None, None) where there is none."""
    leaders = [choice.best] + choice.ties
    names = {r.name for r in leaders}
    found: list[tuple[TrialResult, TrialResult]] = []
    for r in trials:
        m = r.measurement
        if r.name in names or r.state is not TrialState.OK or m is None or not m.early_stop \
                or m.lost_to is None or m.lost_to_metric != metric or r.metric(metric) is None:
            continue
        against = next((x for x in leaders if x.metric(metric) == m.lost_to), None)
        if against is not None and unsettled(against) and inside_interval(metric, r, against):
            found.append((r, against))
    if not found:
        return None, None
    return max(found, key=lambda pair: pair[0].metric(metric) * (1 if MAXIMIZE[metric] else -1))
