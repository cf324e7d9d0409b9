"""Comparing measured trials: ties, headroom, and trials that stopped measuring early."""

from dataclasses import replace

from zerotune.trials import MEASURE_DEFAULTS
from zerotune.trials._ranking import choose_best, clearly_worse, most_faster, shown_worse
from zerotune.trials._trial import Measurement, TrialResult, TrialSpec, TrialState


def trial(stage, step, ci, peak, lost_to=None):
    m = Measurement(
        samples_per_step=64,
        step_time_mean=step,
        step_time_std=ci,
        step_time_ci95=ci,
        steps_measured=2,
        stable=lost_to is None,
        early_stop=lost_to is not None,
        lost_to=lost_to,
        lost_to_metric="throughput" if lost_to else "",
    )
    return TrialResult(
        spec=TrialSpec(stage=stage, micro_batch=8), state=TrialState.OK, measurement=m, peak_memory=[peak, peak]
    )


def test_a_trial_shown_worse_by_its_probe_is_not_tied_with_what_beat_it():
    # Stage 2 is 1% slower: within noise of stage 1, with less memory, and shown at most 3%
    # slower. Measured to the end, it is a tie and wins on headroom; stopped early, shown unable
    # to beat stage 1's 32 samples/s, it is neither tied nor picked.
    fast = trial(1, 2.00, 0.02, peak=900)  # 32 samples/s
    slow = trial(2, 2.02, 0.02, peak=500)
    choice = choose_best([fast, slow], "throughput")
    assert choice.best is slow and choice.ties == [fast] and "for its memory headroom" in choice.note
    stopped = replace(
        slow, measurement=replace(slow.measurement, early_stop=True, lost_to=32.0, lost_to_metric="throughput")
    )
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
    choice = choose_best([weaker, stopped], "throughput")
    assert choice.ties == [stopped]  # within noise: not shown worse than the weaker one
    assert choice.best is weaker  # but its two wide steps may hide a 7% loss: no headroom pick


def test_headroom_wins_only_where_its_cost_is_shown_within_the_margin():
    # 2% slower with a wide interval (two steps): within noise, but possibly 7% slower (one-sided
    # 95%), which is more than headroom may cost: the fastest stands, and the note says why.
    fast = trial(1, 2.00, 0.02, peak=900)
    lean = trial(2, 2.04, 0.20, peak=500)
    assert most_faster(fast, lean, "throughput") > MEASURE_DEFAULTS.tie_margin
    choice = choose_best([fast, lean], "throughput")
    assert choice.best is fast and choice.ties == [lean]
    assert "z2_mb8_gas1 has more memory headroom, but it may be up to 6.9% slower" in choice.note
    # 1.5% slower over eight steps: within noise, and shown within the margin: headroom wins.
    tight = replace(
        lean, measurement=replace(lean.measurement, step_time_mean=2.03, step_time_ci95=0.03, steps_measured=8)
    )
    assert most_faster(fast, tight, "throughput") <= MEASURE_DEFAULTS.tie_margin
    assert choose_best([fast, tight], "throughput").best is tight
    # The margin is the user's (MeasureSettings.tie_margin): at 0 the fastest always stands.
    assert choose_best([fast, tight], "throughput", margin=0.0).best is fast
    assert choose_best([fast, tight], "throughput", margin=0.0).ties == [tight]
    # A trial with a single timed step has no interval: never a headroom pick, even 0.75% slower.
    one = replace(
        lean, measurement=replace(lean.measurement, step_time_mean=2.015, step_time_ci95=0.0, steps_measured=1)
    )
    choice = choose_best([fast, one], "throughput")
    assert choice.best is fast and "its cost is unknown" in choice.note


def test_headroom_is_weighed_only_where_the_fastest_s_peak_is_near_the_budget():
    # The same pair as above, shown within the margin: headroom wins where the fastest's peak is
    # 90% of the budget or the budget is unknown; at 45% of it, the fastest stands, and says why.
    fast = trial(1, 2.00, 0.02, peak=900)
    lean = trial(2, 2.03, 0.03, peak=500)
    lean = replace(lean, measurement=replace(lean.measurement, steps_measured=8))
    assert most_faster(fast, lean, "throughput") <= MEASURE_DEFAULTS.tie_margin
    near = [replace(fast, budget=1000), replace(lean, budget=1000)]
    assert choose_best(near, "throughput").best is near[1]
    assert choose_best([fast, lean], "throughput").best is lean
    roomy = [replace(fast, budget=2000), replace(lean, budget=2000)]
    choice = choose_best(roomy, "throughput")
    assert choice.best is roomy[0] and choice.ties == [roomy[1]]
    assert "z1_mb8_gas1's peak is 45% of the memory budget, below the 75% where headroom is weighed" in choice.note


def test_why_a_trial_stopped_early_lost_names_the_test_that_decided(tmp_path):
    # Within the two-sided noise of the best, but shown by its probe unable to beat it: the
    # reason says what decided, never "the order is not certain" (which would call for a
    # re-measurement that was rightly not made).
    from zerotune.results._result import TuningResult

    fast = trial(1, 2.00, 0.02, peak=900)  # 32 samples/s
    stopped = trial(2, 2.02, 0.05, peak=900, lost_to=32.0)
    result = TuningResult(metric="throughput", trials=[fast, stopped], best=fast, best_config={}, results_dir=tmp_path)
    assert result.why_lost(stopped) == (
        "1.0% slower than z1_mb8_gas1 (stopped early: shown, one-sided at 95%, unable to beat 32.0 samples/s)"
    )
    measured = replace(stopped, measurement=replace(stopped.measurement, early_stop=False, lost_to=None))
    assert result.why_lost(measured).endswith("which measured better; the order is not certain")
