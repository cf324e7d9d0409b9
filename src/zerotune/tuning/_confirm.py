"""A confirmed choice: before the final pick, the configurations within noise of the best (at
most 3, see confirm_candidates) are measured again, interleaved (A B C, and C B A unless the
first round settled it; less those it showed slower beyond noise, see second_round) in the same
warm processes (across groups of hosts: a round's candidates at once, one per group, see
side_by_side), and the choice is made on those figures. Interleaving puts the machine's drift
(other load, thermal, a noisy neighbour) on every candidate alike, which separate trials minutes
apart cannot, and the second round's reversed order cancels a steady drift across the rounds.
In the first round, each measures on past its window while its own steps can settle its
comparison with the one leading (see settle_target).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..results import Confirmation, confirmed_of, first_in, start_rounds
from ..trials import (
    MAXIMIZE,
    MEASURE_DEFAULTS,
    Choice,
    TrialResult,
    TrialState,
    better,
    choose_best,
    clearly_worse,
    figure_of,
    fmt_metric,
    most_faster,
    within_noise,
)
from ._confirm_candidates import candidates

if TYPE_CHECKING:
    from ..launch import Launcher, Slot
    from ..results import TuningRecord
    from ._trial_factory import TrialFactory

# Each re-measurement measures for its window (MeasureSettings.remeasure_seconds), and never
# fewer timed steps than a trial (the probe's fewest_steps: three, so a slow config's runs past
# it): interleaved rounds (at most MeasureSettings.remeasure_rounds), not one long window, are
# what make the comparison fair, and a tie costs a few seconds per candidate to settle.


def confirm(
    factory: TrialFactory,
    launcher: Launcher,
    slots: list[Slot],
    record: TuningRecord,
    choice: Choice,
    earlier: Confirmation | None = None,
) -> Confirmation | None:
    """Re-measure ``choice.best`` and its ties, and a loser stopped early against an unsettled
    figure (see confirm_candidates; None when there are none); the choice made on the
    re-measured figures is ``best``. ``earlier``: the last tuning's confirmation, reused when
    this tuning launched nothing (every trial reused: what they measured is unchanged) and it
    re-measured the same candidates against the same tie margin, so that a rerun that resumes measures nothing again."""
    metric, margin = factory.request.autotuning.metric, factory.measure.tie_margin
    own = next((t for t in record.trials if factory.own_spec is not None and t.spec == factory.own_spec), None)
    chosen = candidates(choice, record.trials, metric, own)
    group = chosen.group
    if len(group) < 2:
        return None
    if earlier is not None and earlier.runs and record.launched == 0 and earlier.tie_margin == margin:
        order, first = first_in(group, earlier.from_trial)
        if _reusable(earlier, order, first, metric, margin):
            out, by_name = start_rounds(order, first)
            for i, result in enumerate(earlier.runs):
                out.runs.append(result)
                by_name[result.name].append(result)
                record.emit("confirm", 1 if i < _first_round(out) else 2, result.spec, result, "from disk")
                record.reused(result)
            return _decide(out, by_name, order, choice, metric, margin, reused=True, joined=chosen.note())
    group, first = first_in(group, trial_first(slots, record, group))
    out, by_name = start_rounds(group, first)
    runs = [r for r in group if r.name != first]
    rounds = factory.measure.remeasure_rounds
    apart = side_by_side(slots)
    for round_ in range(1, rounds + 1):
        for wave in (
            [runs[i : i + len(slots)] for i in range(0, len(runs), len(slots))] if apart else [[r] for r in runs]
        ):
            jobs = []
            for i, r in enumerate(wave):
                job = factory.make_confirm_job(record.store, r.spec, round_, slots[i])
                leader = choose_best(confirmed_of(by_name, group), metric, margin) if round_ == 1 else None
                if leader is not None:
                    job.settle = settle_target(leader.best, r, metric, margin)
                jobs.append((r, job, leader))
            results = run_together(launcher, [job for _, job, _ in jobs])
            for (r, job, leader), result in zip(jobs, results, strict=True):
                out.runs.append(result)
                by_name[r.name].append(result)
                against = f", its comparison with {leader.best.name} to settle" if job.settle else ""
                record.emit("confirm", round_, r.spec, result, f"round {round_} of at most {rounds}{against}")
        if round_ < rounds and not (runs := second_round(by_name, group, first, metric, margin)):
            break
    return _decide(out, by_name, group, choice, metric, margin, reused=False, joined=chosen.note(), apart=apart)


def side_by_side(slots: list[Slot]) -> bool:
    """Re-measure the candidates of a round at once, each on its own group of hosts: where the
    slots are disjoint nodes, which share nothing but the network, running together puts the
    cluster's drift on every candidate alike, as interleaving does on one slot; the reversed
    order of the second round puts each candidate on other nodes, so a slow node weighs on
    every candidate. On one node, candidates side by side would share its memory and buses:
    there they take turns in one slot."""
    return len(slots) > 1 and all(s.hosts for s in slots)


def run_together(launcher: Launcher, jobs: list) -> list[TrialResult]:
    """``jobs`` run at once (each on its own slot), their results in the same order."""
    if len(jobs) == 1:
        return [launcher.run(jobs[0])]
    pool = launcher.trial_pool(len(jobs))
    try:
        futures = [pool.submit(launcher.run, job) for job in jobs]
        pending = set(futures)
        while pending:
            pending -= pool.wait_any(pending)
        return [f.result() for f in futures]
    finally:
        pool.shutdown()


def settle_target(leader: TrialResult, candidate: TrialResult, metric: str, margin: float) -> dict | None:
    """What a first-round re-measurement of ``candidate`` is measured against (TrialJob.settle):
    the candidate leading so far (the trial that stood as its first figure, or the runs before).
    A fixed window settles an exact tie only in a second round of every candidate (about 20 s
    on the bundled example); so after its window the re-measurement measures on, up to a
    trial's ``max_seconds``, while the steps left could settle the pair (see settle_verdict),
    and stops once they have. It never stops before its window: a sequential test that may
    stop at its first settled look answers wrongly more often (tests/test_probe.py measures
    both). The round's later candidates and the second round still follow settled(). None
    where the leader has no interval."""
    lead, m = figure_of(leader, metric), candidate.measurement
    if lead is None or m is None or not math.isfinite(lead.rel_se):
        return None
    scale = None
    if MAXIMIZE[metric]:
        value = candidate.metric(metric)
        if value is None:
            return None
        scale = value * m.step_time_mean  # samples (or FLOPs) per step of this config
    return {
        "maximize": MAXIMIZE[metric],
        "value": lead.value,
        "ci": lead.ci,
        "rel_se": lead.rel_se,
        "df": lead.df if math.isfinite(lead.df) else None,
        "scale": scale,
        "margin": margin,
    }


def trial_first(slots: list[Slot], record: TuningRecord, group: list[TrialResult]) -> str | None:
    """The candidate whose trial can stand as its first-round figure: the last trial this tuning
    ran, when it is a candidate, ran warm in the one slot the re-measurements use, kept its
    processes, and measured to the end (not stopped early). Round 1 is then that trial and, right
    after it in the same processes, the others: interleaved all the same, one run fewer."""
    last = record.last_run
    if last is None or len(slots) != 1 or last.name not in (r.name for r in group):
        return None
    m = last.measurement
    ok = last.state is TrialState.OK and m is not None and not m.early_stop and last.warm and not last.retired
    return last.name if ok else None


def _first_round(out: Confirmation) -> int:
    """Re-measurements in the first round: every candidate but the one its trial stood for."""
    return len(out.candidates) - (out.from_trial is not None)


def _reusable(earlier: Confirmation, group: list[TrialResult], first: str | None, metric: str, margin: float) -> bool:
    """The earlier re-measurements are whole rounds of these candidates in this order (round 1
    without ``first``, whose trial stood for it), as many as this tuning would run on the same
    figures."""
    if first != earlier.from_trial:
        return False  # its trial stood for a candidate that is none now
    first_round = [r.name for r in group if r.name != first]  # see _first_round
    got = [r.name for r in earlier.runs]
    if got[: len(first_round)] != first_round:
        return False
    by_name = {n.name: [r for r in earlier.runs[: len(first_round)] if r.name == n.name] for n in group}
    if first is not None:
        by_name[first].insert(0, group[0])
    return got[len(first_round) :] == [r.name for r in second_round(by_name, group, first, metric, margin)]


def second_round(
    by_name: dict[str, list[TrialResult]],
    group: list[TrialResult],
    first: str | None,
    metric: str,
    margin: float = MEASURE_DEFAULTS.tie_margin,
) -> list[TrialResult]:
    """What the second round measures after the first (``by_name``: each candidate's first-round
    figure), in reversed order: nothing where the first settled the choice and no drift may have
    made it (see settled, drifted). Otherwise the pick, every candidate in question and each one
    whose drift may have made the verdict; a candidate slower beyond noise than the pick, whose
    own figures give no reason to doubt that, is left out, as is one whose re-measurement failed
    (dropped for good). Where the pick itself may have been flattered by its window, every
    candidate it beat is measured again with it: they are what it is compared with."""
    confirmed = {c.name: c for c in confirmed_of(by_name, group)}
    moved = drifted(by_name, group, first, metric, margin)
    if settled(list(confirmed.values()), metric, margin) and not moved:
        return []
    pick = choose_best(list(confirmed.values()), metric, margin)
    assert pick is not None, "settled() holds where fewer than two candidates measured"
    keep = [
        r
        for r in group
        if r.name in confirmed
        and (
            pick.best.name in moved
            or r.name in moved
            or r.name == pick.best.name
            or not clearly_worse(metric, confirmed[r.name], pick.best)
        )
    ]
    return keep[::-1] if len(keep) > 1 else []


def settled(confirmed: list[TrialResult], metric: str, margin: float = MEASURE_DEFAULTS.tie_margin) -> bool:
    """True when another round cannot change the choice by more than the tie margin: against the
    pick, every other candidate is slower beyond noise, or the most it can be faster (the upper
    end of a one-sided 95% interval of its relative difference, see most_faster) is within
    ``margin`` (MeasureSettings.tie_margin). A pick made for its headroom is already shown that close to the fastest (see
    headroom_costs_little), and a pick that is the fastest faces only slower candidates, so
    one interleaved round settles it unless the intervals are wide; then a second runs."""
    pick = choose_best(confirmed, metric, margin)
    if pick is None or len(confirmed) < 2:
        return True  # the others failed: a failed re-measurement drops its candidate for good
    best = pick.best
    return all(c is best or clearly_worse(metric, c, best) or most_faster(c, best, metric) <= margin for c in confirmed)


def drifted(
    by_name: dict[str, list[TrialResult]],
    group: list[TrialResult],
    first: str | None,
    metric: str,
    margin: float = MEASURE_DEFAULTS.tie_margin,
) -> list[str]:
    """The candidates whose first re-measurement disagrees with their own trial beyond noise in
    a way that may have made the first round's choice: the machine's speed moved between the
    two (on a shared machine one config read 36.0 samples/s in its trial and 31.1 a minute
    later), so one round's verdict rests on that speed holding from one candidate's window to
    the next, which the evidence says it may not; a second round, in reversed order, measures
    every candidate again. (One round had picked a config that four alternating rounds then
    measured 4% slower: its re-measurement read 7% above its trial.) Some drifts cannot have
    made the verdict, and do not count: the pick measured again below its trial,
    a candidate measured above its trial that still lost, or one below its trial whose trial
    was behind the pick's trial too (the trials had it losing as well). Only the first round is
    read (each candidate's first figure)."""
    first_round = {name: runs[:1] for name, runs in by_name.items()}
    pick = choose_best(confirmed_of(first_round, group), metric, margin)
    trials = {r.name: r for r in group}
    out = []
    for trial in group:
        again = first_round[trial.name]
        if (
            trial.name == first
            or pick is None
            or not again
            or again[0].state is not TrialState.OK
            or within_noise(metric, trial, again[0])
        ):
            continue  # ``first``: its trial is its first-round figure, nothing to compare it with
        value, was = again[0].metric(metric), trial.metric(metric)
        rose = value is not None and was is not None and better(metric, value, was)
        if trial.name == pick.best.name:
            moved = rose  # a pick flattered by its window
        else:  # a loser whose window may have wronged it, where the trials had it level or ahead
            lead = trials[pick.best.name].metric(metric)
            moved = not rose and was is not None and lead is not None and not better(metric, lead, was)
        if moved:
            out.append(trial.name)
    return out


def _decide(
    out: Confirmation,
    by_name: dict[str, list[TrialResult]],
    group: list[TrialResult],
    choice: Choice,
    metric: str,
    margin: float,
    *,
    reused: bool,
    joined: str = "",
    apart: bool = False,
) -> Confirmation:
    out.confirmed = {c.name: c for c in confirmed_of(by_name, group)}
    pick = choose_best(list(out.confirmed.values()), metric, margin)
    if pick is None:
        out.note = "re-measuring the configurations within noise failed; the choice stands as first measured"
        return out
    out.best = pick.best.name
    figures = ", ".join(f"{name} {fmt_metric(metric, c)}" for name, c in out.confirmed.items())
    failed = [n for n in out.candidates if n not in out.confirmed]
    second = [r.name for r in out.runs[_first_round(out) :]]
    rounds = 1 if not second else 2  # one round, or more
    letter = {r.name: "ABCDEFGH"[i] for i, r in enumerate(group)}
    order = " ".join(letter[n] for n in out.candidates + second)
    if out.from_trial is not None:
        order += "; A's first figure is its trial, which ran just before B in the same processes"
    verdict = pick.note or f"chose {out.best}; the others are slower beyond noise"
    if pick.ties and rounds == 1:
        verdict += f"; after one round none can be more than {margin:.0%} faster than {out.best}, so no second round"
    if rounds > 1 and (moved := drifted(by_name, group, out.from_trial, metric, margin)):
        whose = "its trial" if len(moved) == 1 else "their trials"
        verdict += (
            f"; {', '.join(moved)} measured again differed from {whose} beyond noise (the machine's "
            "speed moved between them), so one round could not settle it"
        )
    if left := [n for n in out.candidates if second and n not in second and n not in failed]:
        verdict += f"; {', '.join(left)} left out of the second round: slower beyond noise than the first round's pick"
    if out.best != choice.best.name:
        verdict += f" (the trials alone had chosen {choice.best.name})"
    out.note = (
        f"confirmed: measured {len(group)} configurations within noise of each other again, "
        + ("each round at once on separate groups of hosts " if apart else "interleaved ")
        + ("(by an earlier run of this tuning, reused) " if reused else "")
        + f"({order}): {figures}; "
        + (f"{joined}; " if joined else "")
        + verdict
        + (f"; re-measuring failed for {', '.join(failed)}" if failed else "")
    )
    return out
