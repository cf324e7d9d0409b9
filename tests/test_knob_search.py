"""The knob phase in the tuner (fast: false, user lists), with the fake launcher."""

import pytest

from fakes import FakeMachine
from zerotune import ConfigError
from zerotune.trials._trial import TrialState

OC = "zero_optimization.overlap_comm"
RBS = "zero_optimization.reduce_bucket_size"


def knobbed(result):
    return [t for t in result.trials if any(k == OC or k == RBS or "bucket" in k for k, _ in t.spec.overrides)]


def test_fast_false_searches_knobs_of_the_stages_that_can_win(tuner_factory):
    machine = FakeMachine(knob_speed={(OC, True): 1.25, (RBS, 5e7): 0.8}, speed={0: 1.0, 1: 0.7, 2: 1.05, 3: 0.8})
    tuner = tuner_factory({"fast": False, "tuner_early_stopping": 50, "tuner_num_trials": 500}, machine=machine)
    result = tuner.tune()
    knob_trials = knobbed(result)
    assert knob_trials and {t.spec.stage for t in knob_trials} == {2}  # stages 0 and 1 cannot win; 3 not run
    best = dict(result.best.spec.overrides)
    assert best[OC] is True and best[RBS] != 5e7
    assert "oc=on" in result.best.name and "rbs=" in result.best.name
    assert result.best_config["zero_optimization"]["overlap_comm"] is True
    assert any("searching" in n and "with gridsearch" in n for n in result.notes)
    assert any("knobs not searched" in n for n in result.notes)


def test_early_stopping_ends_a_flat_knob_search(tuner_factory):
    tuner = tuner_factory(
        {"fast": False, "tuner_early_stopping": 3}, machine=FakeMachine(speed={0: 1.0, 1: 1.2, 2: 0.5, 3: 0.4})
    )
    result = tuner.tune()
    assert len(knobbed(result)) == 3  # knobs change nothing here: 3 trials, then stop
    assert any("tuner_early_stopping=3" in n for n in result.notes)


@pytest.mark.parametrize("tuner_type", ["random", "model_based"])
def test_tuner_type_chooses_the_searcher_and_finds_the_best_knobs(tuner_factory, tuner_type):
    machine = FakeMachine(knob_speed={(OC, True): 1.3}, speed={0: 1.0, 1: 0.6, 2: 1.2, 3: 0.4})
    result = tuner_factory({"fast": False, "tuner_type": tuner_type, "tuner_early_stopping": 8}, machine=machine).tune()
    assert dict(result.best.spec.overrides)[OC] is True
    assert any(f"with {tuner_type}" in n for n in result.notes)


def test_user_lists_are_dimensions_even_with_fast_true(tuner_factory):
    machine = FakeMachine(knob_speed={(OC, False): 1.3}, speed={0: 1.0, 1: 0.6, 2: 1.2, 3: 0.4})
    tuner = tuner_factory(
        machine=machine, config={"zero_optimization": {"stage": [1, 2], "overlap_comm": [True, False]}}
    )
    result = tuner.tune()
    first = tuner.launcher.jobs[0]
    assert (first.trial_dir / "ds_config.json").read_text().count('"overlap_comm": true')  # the first value
    assert dict(result.best.spec.overrides)[OC] is False
    assert all(set(dict(t.spec.overrides)) <= {OC} for t in result.trials)  # only the user's dimension


def test_memory_check_prunes_knob_points_that_would_not_fit(tuner_factory):
    # Each element of reduce_bucket_size costs 4 bytes (fp32): 1e9 of them leave no room for 16 samples.
    machine = FakeMachine(reduce_bucket_bytes=4, num_params=1_200_000_000)
    tuner = tuner_factory(
        {"tuner_early_stopping": 50},
        machine=machine,
        memory="7GiB",
        config={"zero_optimization": {"stage": [1], "reduce_bucket_size": [5e7, 1e9]}},
    )
    result = tuner.tune()
    pruned = [t for t in result.trials if t.state is TrialState.PRUNED and "rbs=1e9" in t.name]
    assert pruned and all(t.reason.startswith("predicted") for t in pruned)
    assert not [j for j in tuner.launcher.jobs if "rbs=1e9" in j.spec.name and j.spec.micro_batch >= 16]


def test_invalid_combinations_are_pruned_before_anything_runs(tuner_factory):
    # Stage 2 fits micro-batch 16 at most, stage 3 fits 32: stage 3 is searched.
    tuner = tuner_factory(
        machine=FakeMachine(speed={0: 1.0, 1: 1.0, 2: 0.9, 3: 1.2}),
        memory="5.1GiB",
        config={"zero_optimization": {"stage": [2, 3], "offload_param": {"device": ["none", "nvme"]}}},
    )
    result = tuner.tune()
    nvme = [t for t in result.trials if "op=nvme" in t.name]
    assert nvme and all(t.state is TrialState.PRUNED and "nvme_path" in t.reason for t in nvme)
    assert not [t for t in result.trials if t.spec.stage == 2 and "op=" in t.name]  # offload_param is stage 3's


@pytest.mark.parametrize(
    "zero, message",
    [
        ({"reduce_bucket_size": []}, "empty list"),
        ({"overlap_comm": [True, True]}, "repeats a value"),
        ({"offload_optimizer": {"device": ["cpu", "disk"]}}, "not an offload device"),
    ],
)
def test_bad_lists_are_clear_errors(tuner_factory, zero, message):
    with pytest.raises(ConfigError, match=message):
        tuner_factory(config={"zero_optimization": {"stage": 2, **zero}})


def test_trial_cap_and_time_budget_also_bound_the_knob_search(tuner_factory, monkeypatch):
    result = tuner_factory({"fast": False, "tuner_num_trials": 9, "tuner_early_stopping": 50}).tune()
    assert len(result.trials) - len([t for t in result.trials if t.state is TrialState.PRUNED]) <= 9
    assert any("tuner_num_trials=9" in n for n in result.notes)
