"""Comparing measured trials: ties, headroom, and trials that stopped measuring early."""
from dataclasses import replace

from zerotune.ranking import choose_best
from zerotune.trial import Measurement, TrialResult, TrialSpec, TrialState


def trial(stage, step, ci, peak, early_stop=False):
    m = Measurement(samples_per_step=64, step_time_mean=step, step_time_std=ci, step_time_ci95=ci,
                    steps_measured=2, stable=not early_stop, early_stop=early_stop)
    return TrialResult(spec=TrialSpec(stage=stage, micro_batch=8), state=TrialState.OK, measurement=m,
                       peak_memory=[peak, peak])


def test_a_trial_that_stopped_early_is_never_a_tie():
    # Stage 2 is 2% slower with a wide interval (two steps): within noise of stage 1, with less
    # memory. Measured to the end, it is a tie and wins on headroom; stopped early (its probe
    # showed it cannot beat stage 1), it is neither tied nor picked.
    fast = trial(1, 2.00, 0.02, peak=900)
    slow = trial(2, 2.04, 0.20, peak=500)
    choice = choose_best([fast, slow], "throughput")
    assert choice.best is slow and choice.ties == [fast]
    stopped = replace(slow, measurement=replace(slow.measurement, early_stop=True))
    choice = choose_best([fast, stopped], "throughput")
    assert choice.best is fast and choice.ties == [] and choice.note == ""
