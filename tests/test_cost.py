"""What a tuning cost and where the time went; what it gained against the user's own config, and when
it pays itself back."""

import io
import json

from fakes import FakeMachine
from zerotune import load_results
from zerotune.cli._progress import JsonEvents
from zerotune.results import compare_with_own, tuning_cost
from zerotune.trials._trial import Measurement, TrialResult, TrialSpec, TrialState


def trial(stage, mb, step, wall, timed, samples=64):
    m = Measurement(
        samples_per_step=samples,
        step_time_mean=step,
        step_time_std=0.0,
        step_time_ci95=0.0,
        steps_measured=10,
        stable=True,
        timed_seconds=timed,
    )
    return TrialResult(
        spec=TrialSpec(stage=stage, micro_batch=mb, grad_accum=64 // (mb * 2)),
        state=TrialState.OK,
        measurement=m,
        wall_time=wall,
    )


def test_time_splits_into_measuring_and_overhead():
    trials = [
        trial(0, 8, 1.0, 30.0, 8.0),
        trial(1, 8, 0.5, 25.0, 5.0),
        TrialResult(spec=TrialSpec(stage=2, micro_batch=8), state=TrialState.PRUNED),
    ]
    cost = tuning_cost(trials, 60.0)
    assert (cost.trial_time, cost.measuring, cost.overhead, cost.trials) == (55.0, 13.0, 42.0, 2)
    assert "42 s launch, start-up, warm-up and teardown (76%)" in cost.lines()[0]


def test_the_speed_up_over_the_users_config_and_its_payback():
    own, best = trial(0, 8, 1.0, 30.0, 8.0), trial(1, 8, 0.5, 30.0, 5.0)
    got = compare_with_own([own, best], best, own.spec, {}, "throughput", 60.0)
    # 0.5 s saved per step of 64 samples: 60 s of tuning are back after 120 steps (1 min at 0.5 s).
    assert (got.speedup, got.payback_steps, got.payback_seconds) == (2.0, 121, 60.5) and not got.fastest
    assert "the choice is 2.00x as fast" in "\n".join(got.lines()) and "after 121 training steps" in got.lines()[-1]
    chosen = compare_with_own([own, best], own, own.spec, {}, "throughput", 60.0)
    assert chosen.chosen and "your config is the choice" in chosen.lines()[-1]
    assert compare_with_own([own, best], best, None, {}, "throughput", 60.0) is None


def test_the_speed_up_has_a_95_percent_interval_from_both_figures():
    own, best = trial(0, 8, 1.0, 30.0, 8.0), trial(1, 8, 0.5, 30.0, 5.0)
    own.measurement.step_time_ci95, own.measurement.step_time_std = 0.05, 0.07
    best.measurement.step_time_ci95, best.measurement.step_time_std = 0.02, 0.03
    got = compare_with_own([own, best], best, own.spec, {}, "throughput", 60.0)
    assert got.low < 2.0 < got.high and got.high - got.low < 0.4
    assert f"(95%: {got.low:.2f}-{got.high:.2f})" in "\n".join(got.lines())


def test_a_users_config_within_noise_of_the_choice_is_already_the_fastest():
    own, best = trial(0, 8, 1.0, 30.0, 8.0), trial(1, 8, 0.99, 30.0, 5.0)
    own.measurement.step_time_ci95 = best.measurement.step_time_ci95 = 0.05
    own.measurement.step_time_std = best.measurement.step_time_std = 0.07
    got = compare_with_own([own, best], best, own.spec, {}, "throughput", 60.0)
    assert got.fastest and got.payback_steps is None
    assert "your config is already the fastest within noise" in got.lines()[-1]


def test_a_users_config_that_failed_is_named_with_how_it_ended():
    own, best = trial(0, 8, 1.0, 30.0, 8.0), trial(1, 8, 0.5, 30.0, 5.0)
    own.state, own.reason, own.measurement = TrialState.OOM, "CUDA out of memory", None
    got = compare_with_own([own, best], best, own.spec, {}, "throughput", 60.0)
    assert got.lines() == [f"your config: {own.name} ended oom (CUDA out of memory)"] and got.speedup is None


def test_the_summary_and_json_say_what_the_tuning_cost(tuner_factory, tmp_path):
    machine = FakeMachine(knob_speed={("zero_optimization.overlap_comm", True): 1.5})
    tuner = tuner_factory(
        memory="16GiB",
        machine=machine,
        autotuning={"fast": False},
        config={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": [8]},
    )
    assert tuner.trials.own_spec == TrialSpec(stage=2, micro_batch=8, grad_accum=4)
    result = tuner.tune()
    assert dict(result.best.spec.overrides).get("zero_optimization.overlap_comm") is True
    assert result.own.payback_steps is not None and result.cost.trials == tuner.record.launched
    assert tuner.record.trials[0].spec == tuner.trials.own_spec  # the user's config ran first
    summary = (tmp_path / "results" / "summary.txt").read_text()
    assert "cost: tuning" in summary and f"payback: after {result.own.payback_steps} training steps" in summary
    assert "your config: z2_mb8_gas4" in summary and "the choice is 1.50x as fast" in summary
    events = JsonEvents(io.StringIO())
    events.result(result)
    assert json.loads(events.stream.getvalue())["own"]["payback_steps"] == result.own.payback_steps
    assert load_results(tmp_path / "results").own == result.own
    assert json.loads((tmp_path / "results" / "results.json").read_text())["own"]["name"] == "z2_mb8_gas4"


def test_the_cost_says_how_many_trials_ran_warm_and_why_others_ran_cold():
    a, b, c = trial(0, 8, 1.0, 30.0, 8.0), trial(1, 8, 0.5, 6.0, 5.0), trial(2, 8, 0.5, 20.0, 5.0)
    a.start, b.start = "cold (new warm processes; later trials reuse them)", "warm (trial 2 of its processes)"
    b.retired = "the trial ended oom: CUDA out of memory"
    c.start = "cold: cold trials were asked for (--cold-trials, warm_trials: false)"
    cost = tuning_cost([a, b, c], 60.0)
    assert (cost.warm, cost.launches) == (1, 2)
    line = next(x for x in cost.lines() if x.startswith("processes:"))
    assert "1 of 3 run(s) were warm" in line and "2 launch(es)" in line and "--cold-trials" in line
    assert f"retired after {b.name}: the trial ended oom" in line
    assert not any(
        x.startswith("processes:") for x in tuning_cost([trial(0, 8, 1.0, 30.0, 8.0)], 1.0).lines()
    )  # older results: unknown


def test_a_rerun_that_resumes_counts_the_time_of_what_it_reused(tuner_factory, tmp_path):
    """A rerun that reuses every trial takes seconds; its cost still names what the tuning took,
    in the summary, the JSON result and `zerotune show`."""
    machine = FakeMachine(trial_seconds=10.0, speed={0: 1.0, 1: 1.01, 2: 0.5, 3: 0.4})
    first = tuner_factory(memory="16GiB", machine=machine).tune()
    assert first.cost.remeasured > 0, "the machine's stages 0 and 1 tie: the rerun must reuse re-measurements too"
    assert first.cost.earlier_time == 0 and first.cost.trial_time == 10.0 * (first.launched + first.cost.remeasured)
    again = tuner_factory(memory="16GiB", machine=machine).tune()
    cost = again.cost
    assert again.launched == 0 and cost.remeasured == first.cost.remeasured
    assert cost.earlier_time == cost.trial_time == first.cost.trial_time
    assert cost.total_time == cost.wall_time + cost.earlier_time and cost.wall_time < cost.earlier_time
    summary = (tmp_path / "results" / "summary.txt").read_text()
    assert f"tuning {cost.total_time:.0f} s in all ({cost.wall_time:.0f} s in this run" in summary
    assert f"tuning time {cost.total_time:.0f} s in all" in summary
    events = JsonEvents(io.StringIO())
    events.result(again)
    assert json.loads(events.stream.getvalue())["cost"]["earlier_time"] == cost.earlier_time
    shown = load_results(tmp_path / "results").cost
    assert (shown.earlier_time, shown.total_time) == (cost.earlier_time, cost.total_time)
