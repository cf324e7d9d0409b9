"""Comparing measured trials: ties, headroom, and trials that stopped measuring early."""
from dataclasses import replace

from zerotune.ranking import choose_best, clearly_worse, shown_worse
from zerotune.trial import Measurement, TrialResult, TrialSpec, TrialState


def trial(stage, step, ci, peak, lost_to=None):
    m = Measurement(samples_per_step=64, step_time_mean=step, step_time_std=ci, step_time_ci95=ci,
                    steps_measured=2, stable=lost_to is None, early_stop=lost_to is not None, lost_to=lost_to,
                    lost_to_metric="throughput" if lost_to else "")
    return TrialResult(spec=TrialSpec(stage=stage, micro_batch=8), state=TrialState.OK, measurement=m,
                       peak_memory=[peak, peak])


def test_a_trial_shown_worse_by_its_probe_is_not_tied_with_what_beat_it():
    # Stage 2 is 2% slower with a wide interval (two steps): within noise of stage 1, with less
    # memory. Measured to the end, it is a tie and wins on headroom; stopped early, shown unable
    # to beat stage 1's 32 samples/s, it is neither tied nor picked.
    fast = trial(1, 2.00, 0.02, peak=900)  # 32 samples/s
    slow = trial(2, 2.04, 0.20, peak=500)
    choice = choose_best([fast, slow], "throughput")
    assert choice.best is slow and choice.ties == [fast]
    stopped = replace(slow, measurement=replace(slow.measurement, early_stop=True, lost_to=32.0,
                                                lost_to_metric="throughput"))
    choice = choose_best([fast, stopped], "throughput")
    assert choice.best is fast and choice.ties == [] and choice.note == ""
    assert shown_worse("throughput", stopped, fast) and clearly_worse("throughput", stopped, fast)
    assert not clearly_worse("throughput", slow, fast)  # within noise: not shown


def test_losing_to_a_better_trial_says_nothing_about_a_weaker_one():
    # Stopped against 40 samples/s: that is no evidence against a trial of 32 samples/s.
    weaker = trial(1, 2.00, 0.02, peak=900)
    stopped = trial(2, 2.04, 0.20, peak=500, lost_to=40.0)
    assert not shown_worse("throughput", stopped, weaker) and not clearly_worse("throughput", stopped, weaker)
    assert not shown_worse("latency", stopped, weaker)  # another metric's figure
    assert choose_best([weaker, stopped], "throughput").best is stopped  # tied, and more headroom
