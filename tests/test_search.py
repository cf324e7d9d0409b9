"""Search decisions against a synthetic machine (fake launcher): no processes start."""

from collections import Counter

import pytest

from fakes import MIB, TIGHT_MEMORY, FakeMachine
from zerotune import NoFeasibleConfigError
from zerotune.trials._trial import TrialState


def launched(tuner):
    return [j.spec for j in tuner.launcher.jobs]


def test_largest_fitting_micro_batch_per_stage_with_at_most_one_oom(tuner_factory):
    tuner = tuner_factory(memory="6GiB")  # fits: z0 <=21, z1 <=31, z2/z3 <=32 of {1,2,4,8,16,32}
    result = tuner.tune()
    ok = {}
    for t in result.trials:
        if t.state is TrialState.OK:
            ok[t.spec.stage] = max(ok.get(t.spec.stage, 0), t.spec.micro_batch)
    assert ok == {0: 16, 1: 16, 2: 32}
    # Stage 2 fits the largest micro-batch: stage 3, the same work plus gathering parameters, is not run.
    (z3,) = [t for t in result.trials if t.spec.stage == 3]
    assert z3.state is TrialState.PRUNED and "stage 2 fits the largest micro-batch (32)" in z3.reason
    assert not [j for j in tuner.launcher.jobs if j.spec.stage == 3]
    ooms = Counter(t.spec.stage for t in result.trials if t.state is TrialState.OOM)
    assert all(n <= 1 for n in ooms.values())
    assert len(result.trials) <= 12


def test_jumps_to_the_boundary_instead_of_doubling(tuner_factory):
    machine = FakeMachine(static={0: 1000 * 1024**2}, per_sample=50 * 1024**2)
    tuner = tuner_factory(
        memory="6GiB",
        machine=machine,
        config={"zero_optimization": {"stage": 0}},
        autotuning={"max_train_batch_size": 1024, "max_train_micro_batch_size_per_gpu": 512},
    )
    result = tuner.tune()
    # Candidates are powers of two up to 512; 64 is the largest that fits (1000 + 50 * 64 MiB).
    # From the first guess (16) the memory fit jumps straight there: no doubling, no OOM.
    phase1 = [t.spec.micro_batch for t in result.trials[:2]]
    assert phase1 == [16, 64]
    assert not any(t.state is TrialState.OOM for t in result.trials)


def test_fastest_config_wins(tuner_factory):
    result = tuner_factory(memory="6GiB").tune()
    assert result.best.name == "z2_mb32_gas1"
    assert result.best_config["zero_optimization"]["stage"] == 2
    assert result.best_config["gradient_accumulation_steps"] == 1


def test_latency_is_minimised(tuner_factory):
    result = tuner_factory(memory="6GiB", autotuning={"metric": "latency"}).tune()
    assert result.best.name == "z2_mb32_gas1"
    slowest = max((t for t in result.trials if t.state is TrialState.OK), key=lambda t: t.metric("latency"))
    assert result.best.metric("latency") < slowest.metric("latency")


def test_gradient_accumulation_keeps_the_global_batch(tuner_factory):
    result = tuner_factory(memory="6GiB").tune()
    for t in result.trials:
        assert t.spec.micro_batch * t.spec.grad_accum * 2 == 64


def test_within_noise_prefers_memory_headroom_near_the_budget(tuner_factory, tmp_path):
    machine = FakeMachine(speed={1: 1.006, 2: 1.0}, rel_ci=0.01)
    config = {"zero_optimization": {"stage": [1, 2]}, "train_micro_batch_size_per_gpu": [8]}
    result = tuner_factory(machine=machine, memory=TIGHT_MEMORY, config=config).tune()
    fastest = max(result.trials, key=lambda t: t.metric("throughput"))
    assert fastest.spec.stage == 1
    assert result.best.spec.stage == 2  # lower peak memory, and stage 1's is 82% of the budget
    assert any("memory headroom" in n for n in result.notes)
    # Far below the budget (stage 1 at 46% of 8 GiB) the headroom buys nothing: the fastest stands.
    result = tuner_factory(machine=machine, results_dir=tmp_path / "roomy", config=config).tune()
    assert result.best.spec.stage == 1
    assert any(
        "z2_mb8_gas4 has more memory headroom, but z1_mb8_gas4's peak is 46% of the memory budget, "
        "below the 75% where headroom is weighed, so the fastest stands" in n
        for n in result.notes
    )


def test_clear_winner_is_not_overridden_by_headroom(tuner_factory):
    machine = FakeMachine(speed={1: 1.2, 2: 1.0}, rel_ci=0.01)
    result = tuner_factory(
        machine=machine, config={"zero_optimization": {"stage": [1, 2]}, "train_micro_batch_size_per_gpu": [8]}
    ).tune()
    assert result.best.spec.stage == 1


def test_user_offload_rules_out_lower_stages(tuner_factory):
    tuner = tuner_factory(config={"zero_optimization": {"stage": "all", "offload_param": {"device": "cpu"}}})
    result = tuner.tune()
    pruned = [t for t in result.trials if t.state is TrialState.PRUNED]
    assert {t.spec.stage for t in pruned} == {0, 1, 2}
    assert all("stage 3" in t.reason for t in pruned)
    assert {j.spec.stage for j in tuner.launcher.jobs} == {3}
    assert result.best_config["zero_optimization"]["offload_param"] == {"device": "cpu"}


def test_first_guess_oom_goes_lower(tuner_factory):
    machine = FakeMachine(static={0: 1000 * 1024**2}, per_sample=400 * 1024**2)
    result = tuner_factory(memory="3GiB", machine=machine, config={"zero_optimization": {"stage": 0}}).tune()
    assert result.best.spec.micro_batch == 4  # 1000 + 400*4 = 2600 MiB <= 3072; 8 does not fit


def test_what_an_oom_held_prunes_smaller_micro_batches_that_cannot_fit(tuner_factory):
    """As on a lent H200 under a 600 MB budget: stage 1 ran out at micro-batch 8 holding 2.26 GiB,
    most of it a gradient bucket allocated after the first forward (not in the static reading),
    and the search then launched micro-batch 2, which ran out too. What the first one held shows
    that the smaller one cannot fit: it is pruned, with why, not launched."""
    mib = 1024**2
    machine = FakeMachine(static={0: 100 * mib, 1: 100 * mib}, lazy={1: 4000 * mib}, per_sample=10 * mib)
    tuner = tuner_factory(
        memory="1GiB",
        machine=machine,
        config={"zero_optimization": {"stage": [0, 1]}},
        autotuning={"min_train_micro_batch_size_per_gpu": 2, "max_train_micro_batch_size_per_gpu": 8},
    )
    result = tuner.tune()
    stage1 = [t for t in result.trials if t.spec.stage == 1]
    assert [(t.spec.micro_batch, t.state) for t in stage1] == [(8, TrialState.OOM), (2, TrialState.PRUNED)]
    # 4180 MiB held at 8 (its static 100): micro-batch 2 needs 4180 / 4 + 100 * 3 / 4 less 4%, 1075 MiB
    assert "needs at least 1.05 GiB > budget 1.00 GiB, by z1_mb8_gas4, which held 4.08 GiB" in stage1[1].reason
    assert [j.spec.stage for j in tuner.launcher.jobs].count(1) == 1
    assert result.best.spec.stage == 0


def test_an_oom_far_above_the_smaller_micro_batches_does_not_prune_them(tuner_factory):
    """Activations that scale with the micro-batch: the bound from an OOM at 16 leaves 4 open,
    and 4 fits."""
    mib = 1024**2
    machine = FakeMachine(static={0: 100 * mib}, per_sample=100 * mib)
    result = tuner_factory(
        memory="1GiB",
        machine=machine,
        config={"zero_optimization": {"stage": 0}},
        autotuning={"min_train_micro_batch_size_per_gpu": 4, "max_train_micro_batch_size_per_gpu": 64},
    ).tune()
    assert not any(t.state is TrialState.PRUNED and "needs at least" in t.reason for t in result.trials)
    assert result.best.spec.micro_batch == 8  # 100 + 8 * 100 = 900 MiB <= 1024; 16 does not fit


def test_crashing_stage_does_not_stop_the_tuning(tuner_factory):
    machine = FakeMachine(crash={"z1_mb16_gas2"})
    result = tuner_factory(machine=machine, memory="6GiB").tune()
    assert any(t.state is TrialState.CRASHED for t in result.trials)
    assert any("stage 1" in n and "crashed" in n for n in result.notes)
    assert result.best is not None


def test_nothing_fits_is_a_clear_error_and_keeps_trials(tuner_factory, tmp_path):
    with pytest.raises(NoFeasibleConfigError, match="no configuration ran successfully"):
        tuner_factory(memory="300MiB").tune()  # not even with offload (a quarter of 2000 MiB stays)
    assert list((tmp_path / "results").glob("*/result.json"))
    assert any("oo=cpu" in p.parent.name for p in (tmp_path / "results").glob("*/result.json"))


def test_trial_cap(tuner_factory):
    tuner = tuner_factory(autotuning={"tuner_num_trials": 2})
    result = tuner.tune()
    assert len(tuner.launcher.jobs) == 2
    assert any("tuner_num_trials=2" in n for n in result.notes)


def test_fixed_micro_batch_list_is_respected(tuner_factory):
    tuner = tuner_factory(config={"train_micro_batch_size_per_gpu": [4, 8]})
    tuner.tune()
    assert {j.spec.micro_batch for j in tuner.launcher.jobs} <= {4, 8}


def test_stages_that_cannot_win_get_no_more_trials(tuner_factory):
    machine = FakeMachine(speed={0: 0.5, 1: 1.0, 2: 0.5, 3: 0.5})
    tuner = tuner_factory(machine=machine, memory="16GiB")
    result = tuner.tune()
    per_stage = Counter(j.spec.stage for j in tuner.launcher.jobs)
    assert per_stage[1] == 2  # 32, then 16 is clearly slower: smaller ones are not tried
    assert per_stage[3] == 0 and per_stage[2] == 1  # stage 2 fits every micro-batch: stage 3 cannot win
    assert any("skipped smaller micro-batches; its best" in n and "measured over 5% behind" in n for n in result.notes)


def test_why_lost_names_the_real_reason(tuner_factory):
    machine = FakeMachine(speed={1: 1.006, 2: 1.0}, rel_ci=0.01)
    result = tuner_factory(
        machine=machine,
        memory=TIGHT_MEMORY,
        config={"zero_optimization": {"stage": [1, 2]}, "train_micro_batch_size_per_gpu": [8]},
    ).tune()
    (loser,) = [t for t in result.trials if t is not result.best]
    # Both were measured again side by side (a confirmed choice): the reason reads those figures.
    assert result.why_lost(loser) == f"re-measured: within noise of {result.best.name}, which has more memory headroom"
    machine = FakeMachine(speed={1: 1.0, 2: 1.006}, rel_ci=0.01)
    result = tuner_factory(
        machine=machine,
        results_dir=result.results_dir.parent / "r2",
        config={"zero_optimization": {"stage": [1, 2]}, "train_micro_batch_size_per_gpu": [8]},
    ).tune()
    (loser,) = [t for t in result.trials if t is not result.best]
    assert "which measured better" in result.why_lost(loser)


def test_sizes_predicted_not_to_fit_are_recorded_as_pruned_not_launched(tuner_factory):
    tuner = tuner_factory(memory="4GiB")  # stage 3: 2000 MiB + 100 MiB per sample fits up to 20
    result = tuner.tune()
    pruned = [t for t in result.trials if t.state is TrialState.PRUNED and t.reason.startswith("predicted")]
    assert pruned and all("> budget 4.00 GiB" in t.reason for t in pruned)
    launched = {j.spec.name for j in tuner.launcher.jobs}
    assert not launched & {t.name for t in pruned}
    for t in pruned:  # each really would not have fit
        assert tuner.launcher.machine.peak(t.spec) > 4 * 1024**3


def test_an_untried_stage_predicted_not_to_fit_is_pruned_without_a_launch(tuner_factory):
    # Stage 0 fits small micro-batches; stage 1's ZeRO buckets make it larger than the budget.
    machine = FakeMachine.analytic(100_000_000, 300 * MIB)
    tuner = tuner_factory(memory="2GiB", machine=machine)
    result = tuner.tune()
    by_stage = {s: [t for t in result.trials if t.spec.stage == s] for s in range(4)}
    assert [t.state for t in by_stage[1]] == [TrialState.PRUNED]
    assert by_stage[1][0].reason.startswith("predicted ") and "± " in by_stage[1][0].reason
    assert not [j for j in tuner.launcher.jobs if j.spec.stage == 1]
    assert machine.peak(by_stage[1][0].spec) > 2 * 1024**3  # it really would not have fit
    assert any(t.state is TrialState.OK for t in by_stage[2] + by_stage[3])


def test_a_known_parameter_count_prunes_stages_by_model_states_before_any_trial(tuner_factory, tmp_path):
    machine = FakeMachine.analytic(100_000_000, 300 * MIB)
    blind = tuner_factory(memory="1.3GiB", machine=machine, results_dir=tmp_path / "blind")
    found = blind.tune()
    # Without it, the first trial (stage 0, out of memory) tells the count: stages 1 and 2 are
    # pruned by their model states from then on.
    assert [j.spec.stage for j in blind.launcher.jobs][0] == 0 and found.trials[0].state is TrialState.OOM
    assert not {1, 2} & {j.spec.stage for j in blind.launcher.jobs}
    told = tuner_factory(
        {"model_info": {"num_params": 100_000_000}}, memory="1.3GiB", machine=machine, results_dir=tmp_path / "told"
    )
    result = told.tune()
    assert not {1, 2} & {j.spec.stage for j in told.launcher.jobs}
    pruned = [t for t in result.trials if t.spec.stage in (1, 2)]
    assert pruned and all(t.state is TrialState.PRUNED and "model states at least" in t.reason for t in pruned)
    assert result.best.spec.stage == 3


def stage_launches(tuner, stage):
    return [
        j.spec.micro_batch
        for j in tuner.launcher.jobs
        if j.spec.stage == stage and not j.trial_dir.name.startswith("confirm")
    ]


TWIN_STAGES = {"zero_optimization": {"stage": [0, 1]}}


def test_stage_1_follows_stage_0_s_best_micro_batch(tuner_factory):
    # Stages 0 and 1 within noise at every micro-batch, both best at 16 (32 is 2% slower here):
    # stage 0 compares its micro-batches; stage 1 measures only stage 0's best below its own
    # largest, where on its own it would go on to 8 as well.
    machine = FakeMachine(speed={0: 1.0, 1: 0.99}, mb_speed={32: 0.86}, rel_ci=0.02)
    tuner = tuner_factory(machine=machine, config=TWIN_STAGES)
    result = tuner.tune()
    assert stage_launches(tuner, 0) == [8, 32, 16] and stage_launches(tuner, 1) == [32, 16]
    assert result.best.name == "z0_mb16_gas2"
    assert any(
        n.startswith("stage 1: micro-batches below 32 follow stage 0's")
        and n.endswith("stage 0's best is 16; measured that one")
        for n in result.notes
    )


def test_stage_0_follows_stage_1_and_nothing_is_measured_twice(tuner_factory):
    # Stage 1 ahead: it compares first; stage 0's best to follow is then stage 1's 16.
    machine = FakeMachine(speed={0: 0.99, 1: 1.0}, mb_speed={32: 0.86}, rel_ci=0.02)
    tuner = tuner_factory(machine=machine, config=TWIN_STAGES)
    result = tuner.tune()
    assert 8 in stage_launches(tuner, 1) and sorted(stage_launches(tuner, 0)).count(16) == 1
    assert set(stage_launches(tuner, 0)) == {8, 32, 16}  # its first guess, its largest, stage 1's best
    assert any(n.startswith("stage 0: micro-batches below 32 follow stage 1's") for n in result.notes)


def test_without_a_fixed_global_batch_each_stage_compares_its_own(tuner_factory):
    # Accumulation fixed instead of the global batch: the optimizer step's share of a sample's
    # time then changes with the micro-batch, and the stages' curves need not peak alike.
    machine = FakeMachine(speed={0: 1.0, 1: 0.99}, mb_speed={32: 0.86}, rel_ci=0.02)
    tuner = tuner_factory(machine=machine, config=TWIN_STAGES, autotuning={"max_train_batch_size": None})
    result = tuner.tune()
    assert tuner.request.global_batch is None
    assert len(stage_launches(tuner, 1)) > 2 and not any("follow stage" in n for n in result.notes)
