"""Predict, then verify: the throughput model, its error, and pruning of predicted losers."""
import pytest

from fakes import FakeMachine
from zerotune.search import Searcher, Suggestion
from zerotune.throughput import ERROR_FLOOR, Prediction, ThroughputModel
from zerotune.trial import Measurement, TrialResult, TrialSpec, TrialState


def measured(stage, mb, tau, overrides=()):
    """A trial whose time per sample is ``tau`` seconds (64 samples per step)."""
    m = Measurement(samples_per_step=64, step_time_mean=64 * tau, step_time_std=0.0, step_time_ci95=0.0,
                    steps_measured=5, stable=True)
    return TrialResult(spec=TrialSpec(stage=stage, micro_batch=mb, grad_accum=64 // (2 * mb), overrides=overrides),
                       state=TrialState.OK, measurement=m)


def tau(p, q, mb):
    return p + q / mb


def test_a_variant_with_two_trials_is_fitted():
    model = ThroughputModel()
    assert model.predict(TrialSpec(stage=0, micro_batch=8)) is None  # nothing measured yet
    for mb in (4, 16):
        model.observe(measured(0, mb, tau(0.01, 0.08, mb)))
    pred = model.predict(TrialSpec(stage=0, micro_batch=8))
    assert pred.throughput == pytest.approx(1 / tau(0.01, 0.08, 8)) and "2 trials" in pred.basis


def test_a_stage_with_one_trial_takes_the_shape_of_a_fitted_one():
    model = ThroughputModel()
    for mb in (4, 16):
        model.observe(measured(0, mb, tau(0.01, 0.08, mb)))
    model.observe(measured(2, 16, 1.5 * tau(0.01, 0.08, 16)))  # stage 2 costs 1.5x stage 0 throughout
    pred = model.predict(TrialSpec(stage=2, micro_batch=8))
    assert pred.throughput == pytest.approx(1 / (1.5 * tau(0.01, 0.08, 8)))
    assert "micro-batch 16 on the curve of z0" in pred.basis
    assert model.predict(TrialSpec(stage=3, micro_batch=8)) is None  # a stage never measured: no guess


def test_the_error_is_the_largest_seen_and_pruning_waits_for_verification():
    model = ThroughputModel()
    assert model.error == ERROR_FLOOR and not model.verified
    model.verify("a", Prediction(100.0, ""), measured(0, 8, 1 / 90.0))
    assert not model.verified
    model.verify("b", Prediction(100.0, ""), measured(0, 8, 1 / 100.0))
    assert model.verified and model.error == pytest.approx(10 / 90)
    assert "a 100.0/90.0" in model.table() and "at most 11%" in model.table()


def test_failed_trials_teach_and_verify_nothing():
    model = ThroughputModel()
    model.observe(TrialResult(spec=TrialSpec(stage=0, micro_batch=8), state=TrialState.OOM))
    model.verify("x", Prediction(100.0, ""), TrialResult(spec=TrialSpec(stage=0, micro_batch=8),
                                                         state=TrialState.CRASHED))
    assert model.points == {} and model.errors == []


class InOrder(Searcher):
    """Proposes the given specs in turn (a sweep a user might write)."""

    def __init__(self, specs):
        self.specs, self.notes = list(specs), []

    def suggest(self):
        return Suggestion(self.specs.pop(0)) if self.specs else None

    def observe(self, result):
        pass


def test_predicted_losers_are_pruned_once_the_model_is_verified(tuner_factory):
    machine = FakeMachine(rel_ci=0.01)  # throughput rises with the micro-batch, saturating
    order = [32, 4, 16, 8, 2, 1]
    tuner = tuner_factory(machine=machine, searcher=InOrder(TrialSpec(stage=1, micro_batch=mb,
                                                                      grad_accum=64 // (2 * mb)) for mb in order),
                          config={"zero_optimization": {"stage": 1}})
    result = tuner.tune()
    states = {t.spec.micro_batch: t for t in result.trials}
    # 32 and 4 fit the curve; 16 and 8 are predicted and verified; then 2 and 1 are predicted far
    # below the best beyond the model's error, and never launched.
    assert [j.spec.micro_batch for j in tuner.launcher.jobs] == [32, 4, 16, 8]
    assert all(states[mb].state is TrialState.PRUNED and states[mb].reason.startswith("throughput model")
               and "stays below z1_mb32_gas1" in states[mb].reason for mb in (2, 1))
    assert states[16].predicted is not None and states[32].predicted is None
    assert result.best.spec.micro_batch == 32  # the fastest of the whole sweep
    note = next(n for n in result.notes if n.startswith("throughput model, predicted/measured"))
    assert "z1_mb16_gas2" in note and "over 2 trial(s)" in note
    lines = (tuner.results_dir / "summary.txt").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("trial "))
    assert "predicted" in lines[header] and any(line.startswith("z1_mb2_gas16") and "pruned" in line
                                                for line in lines[header:])
    # A rerun replays the same decisions from disk: nothing is launched, the same trials are pruned.
    again = tuner_factory(machine=machine, searcher=InOrder(TrialSpec(stage=1, micro_batch=mb,
                                                                      grad_accum=64 // (2 * mb)) for mb in order),
                          config={"zero_optimization": {"stage": 1}})
    assert [t.state for t in again.tune().trials] == [t.state for t in result.trials] and not again.launcher.jobs
