"""A trial behind the best so far that its time cap could not show slower ends as a tie (probe
_tied): the steps left would decide nothing, and the confirmation measures ties again."""

import json
import random

import pytest

from probe_fakes import Exited, FakeEngine, clock, drive
from zerotune.trials._step_stats import summarize, t95_df

NOISY = [1.0, 1.04, 0.96, 1.03, 0.97, 1.04, 0.96, 1.02, 0.98, 1.03, 0.97, 1.0] * 5  # about 3% per step


def leader(value, rel_se, df=4.0):
    """The best trial so far as TrialJob.to_beat carries it (FakeEngine: 8 samples per step)."""
    return {"metric": "throughput", "value": value, "rel_se": rel_se, "df": df}


def run_trial(probe_factory, tmp_path, steps, **spec):
    probe = probe_factory(clock([1.0] + steps), warmup_steps=1, **spec)
    with pytest.raises(Exited):
        drive(probe, FakeEngine(), len(steps) + 1)
    out = json.loads((tmp_path / "rank0.json").read_text())
    assert out["state"] == "ok"
    return out


def test_behind_a_wide_leader_a_trial_ends_tied_at_its_fewest_steps(probe_factory, tmp_path):
    # 8.0/s at 3% per step, 2% behind a leader of 8.16/s measured to a 3.5% standard error (a
    # capped trial of a noisy hour, about ±10%): no step before the 10 s cap could show it
    # slower, so three steps end it, where without a leader it measures to its cap.
    out = run_trial(probe_factory, tmp_path, NOISY, max_seconds=10.0, to_beat=leader(8.16, 0.035))
    assert out["tied"] and not out["early_stop"] and len(out["intervals"]) == 3
    alone = run_trial(probe_factory, tmp_path, NOISY, max_seconds=10.0, rel_ci=0.001)
    assert not alone["tied"] and len(alone["intervals"]) == 10


def test_a_trial_its_cap_could_show_slower_measures_on(probe_factory, tmp_path):
    # 6% behind a leader known to 1%: three steps cannot show it slower, but the seven left
    # before the cap could, at its mean and spread so far: it measures on, and is stopped early.
    out = run_trial(probe_factory, tmp_path, NOISY, max_seconds=10.0, rel_ci=0.001, to_beat=leader(8.5, 0.01, df=9.0))
    assert not out["tied"] and out["early_stop"] and len(out["intervals"]) > 3
    # 2% behind the same tight leader, it cannot be shown slower before its cap: a tie at once.
    out = run_trial(probe_factory, tmp_path, NOISY, max_seconds=10.0, rel_ci=0.001, to_beat=leader(8.16, 0.01, df=9.0))
    assert out["tied"] and len(out["intervals"]) == 3


def test_a_trial_ahead_of_the_leader_measures_in_full(probe_factory, tmp_path):
    # Ahead of a wide leader it will lead, and later trials are judged against its figure.
    out = run_trial(probe_factory, tmp_path, NOISY, max_seconds=10.0, rel_ci=0.001, to_beat=leader(7.9, 0.035))
    assert not out["tied"] and len(out["intervals"]) == 10


def test_a_settled_trial_and_a_clear_loser_are_not_ties(probe_factory, tmp_path):
    out = run_trial(probe_factory, tmp_path, NOISY, max_seconds=10.0, to_beat=leader(12.0, 0.01))
    assert out["early_stop"] and not out["tied"]
    steady = [1.0, 1.001, 0.999] * 10
    out = run_trial(probe_factory, tmp_path, steady, max_seconds=10.0, to_beat=leader(8.16, 0.035))
    assert not out["tied"] and len(out["intervals"]) == 3  # its interval settled first


def test_a_re_measurement_is_never_cut_as_a_tie(probe_factory, tmp_path):
    # Its comparison is the confirmation's (settle), measured to its window: the 5 s of timed
    # steps it holds (4 here: a fifth, at their mean of 1.0075 s, would end past 5 s).
    settle = {
        "maximize": True,
        "value": 8.16,
        "ci": 8.16 * 0.035 * t95_df(4),
        "rel_se": 0.035,
        "df": 4,
        "scale": 8.0,
        "margin": 0.03,
    }
    out = run_trial(
        probe_factory, tmp_path, NOISY, window_seconds=5.0, max_seconds=10.0, to_beat=leader(8.16, 0.035), settle=settle
    )
    assert not out["tied"] and len(out["intervals"]) == 4


def simulate(probe_factory, tmp_path, gap, draws=200):
    """``draws`` trials of a config ``gap`` slower (a fraction; negative: faster) than a leader,
    at 6% step noise, each against that leader measured as a capped trial is (5 steps), with a
    cap of 5 steps. Per draw: steps timed, tied, stopped early, whether it would be a candidate
    of the confirmation (within noise of the leader and not stopped early), whether its figure
    holds its true mean, and whether it was cut as a tie where its five steps would have read it
    ahead of the leader."""
    from zerotune.trials._step_stats import Figure, within_noise_of

    rng, rows = random.Random(3), []
    for _ in range(draws):
        mean, std, _ = summarize([rng.gauss(1.0, 0.06) for _ in range(5)])
        to_beat = leader(8.0 / mean, std / 5**0.5 / mean)
        lead = Figure(to_beat["value"], to_beat["value"] * to_beat["rel_se"] * t95_df(4), 0.0, 4.0)
        steps = [rng.gauss(1.0 + gap, 0.06) for _ in range(12)]
        # a cap of five steps: at most 5.5 of them, so a sixth would pass it
        out = run_trial(probe_factory, tmp_path, steps, max_seconds=5.5 * (1.0 + gap), rel_ci=0.03, to_beat=to_beat)
        m, _, ci = summarize(out["intervals"])
        mine = Figure(8.0 / m, 8.0 / m * ci / m, 0.0, 0.0)
        rows.append(
            {
                "steps": len(out["intervals"]),
                "tied": out["tied"],
                "stopped early": out["early_stop"],
                "candidate": not out["early_stop"] and within_noise_of(mine, lead),
                "covered": abs(m - (1.0 + gap)) <= ci,
                "lost lead": out["tied"] and 8.0 / summarize(steps[:5])[0] > to_beat["value"],
            }
        )
    return {k: sum(r[k] for r in rows) / draws for k in rows[0]}


def test_the_tie_stop_saves_steps_and_keeps_what_the_search_decides(probe_factory, tmp_path, monkeypatch):
    """Seeded simulation at 6% step noise (a noisy hour's), the same draws with and without the
    tie stop. Exact ties: 3.9 steps on average instead of 4.7, and as many candidates of the
    confirmation (90.5% and 89.5%). A config truly 8% faster: as many candidates (66.5%), 4.9
    steps either way, and in 1% of draws cut as a tie where its five steps would have read it
    ahead of the leader (it stays a candidate instead of leading). One 8% slower: 2.9 steps
    instead of 3.6, stopped early in 57.5% of draws instead of 64%, so a candidate in 42.5%
    instead of 36% (the confirmation takes three at most). Every figure holds its true mean in
    93.5-96.5% of draws. (Figures since the cap stops before a step it can foresee passing it.)"""
    from zerotune.probe import _hooks

    monkeypatch.setattr(_hooks.StepProbe, "beat", lambda self: None)  # 2 heartbeat files a step
    gaps = (0.0, -0.08, 0.08)
    tie = {g: simulate(probe_factory, tmp_path, g) for g in gaps}
    monkeypatch.setattr(_hooks.StepProbe, "_tied", lambda self, iv, measuring: False)
    without = {g: simulate(probe_factory, tmp_path, g) for g in gaps}
    stats = {"tie stop": tie, "without": without}
    assert tie[0.0]["steps"] <= without[0.0]["steps"] - 0.5 and tie[0.0]["tied"] >= 0.3, stats
    assert abs(tie[0.0]["candidate"] - without[0.0]["candidate"]) <= 0.05, stats
    assert abs(tie[-0.08]["candidate"] - without[-0.08]["candidate"]) <= 0.03, stats
    assert tie[-0.08]["lost lead"] <= 0.1, stats
    assert tie[0.08]["steps"] <= without[0.08]["steps"] - 0.5, stats
    assert all(s[g]["covered"] >= 0.9 for s in stats.values() for g in gaps), stats
    assert not any(s[g]["tied"] for g in gaps for s in (without,)), stats
