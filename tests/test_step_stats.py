"""The t quantiles behind every interval: exact at whole degrees of freedom, just above the true
quantile between them (Welch-Satterthwaite's fractions) and beyond the table."""

import math
import random
import statistics

from zerotune.trials._step_stats import t95_df, welch_df


def test_whole_degrees_of_freedom_read_the_table():
    assert (t95_df(1), t95_df(2), t95_df(29)) == (12.706, 4.303, 2.045)
    assert (t95_df(1, one_sided=True), t95_df(29, one_sided=True)) == (6.314, 1.699)
    assert t95_df(0.9) == math.inf and t95_df(math.nan) == math.inf
    assert (t95_df(math.inf), t95_df(math.inf, one_sided=True)) == (1.96, 1.645)


def test_beyond_the_table_stays_at_or_just_above_t():
    # Published quantiles (to four places): the normal's 1.96 and 1.645 would be below them.
    for df, two, one in ((30, 2.0423, 1.6973), (40, 2.0211, 1.6839), (60, 2.0003, 1.6706), (120, 1.9799, 1.6577)):
        assert two <= t95_df(df) < two + 0.002
        assert one <= t95_df(df, one_sided=True) < one + 0.002


def test_fractions_lie_between_their_neighbours_and_fall_with_more_freedom():
    grid = [1 + i / 20 for i in range(20 * 40)]
    for one_sided in (False, True):
        values = [t95_df(df, one_sided=one_sided) for df in grid]
        assert all(a > b for a, b in zip(values, values[1:]))
    assert 4.303 < t95_df(1.77) < 6.0  # rounded down, it was 12.706
    chord = t95_df(12) + (t95_df(11) - t95_df(12)) * (1 / 11.5 - 1 / 12) / (1 / 11 - 1 / 12)
    assert abs(t95_df(11.5) - chord) < 1e-12


def test_two_short_rounds_combined_keep_a_95_percent_interval():
    # What a confirmation does: a config measured in two rounds of two or three steps, with
    # different noise, combined by Welch-Satterthwaite (fractional degrees of freedom).
    rng = random.Random(7)
    covered, gain, trials = 0, [], 4000
    for _ in range(trials):
        rounds = []
        for n, sd in ((rng.choice((2, 3)), 0.03), (rng.choice((2, 3)), 0.06)):
            xs = [rng.gauss(2.0, sd) for _ in range(n)]
            rounds.append((statistics.fmean(xs), statistics.variance(xs) / n, n))
        mean = sum(m for m, _, _ in rounds) / 2
        se = math.sqrt(sum(v for _, v, _ in rounds)) / 2
        df = welch_df([(v, n) for _, v, n in rounds])
        covered += abs(mean - 2.0) <= t95_df(df) * se
        gain.append(t95_df(df) / t95_df(math.floor(df)))
    assert covered / trials >= 0.945  # a true 95% interval (at least), within sampling error
    assert statistics.median(gain) < 0.9  # and narrower than with the degrees of freedom rounded down


# -- disturbed steps ------------------------------------------------------------------------------
from zerotune.trials._step_stats import split_disturbed, summarize  # noqa: E402


def test_a_rare_far_slower_step_is_left_out_and_said():
    # What a shared machine did: one 2.73 s step among 1.9 s ones.
    steps = [1.91, 1.88, 1.95, 2.73, 1.90, 1.93, 1.89, 1.92]
    split = split_disturbed(steps)
    assert split.left_out == [2.73] and len(split.kept) == 7 and abs(split.median - 1.915) < 1e-9
    mean, _, ci = summarize(split.kept)
    assert ci < 0.02 * mean  # with it, the interval was wider than the 3% a trial stops at
    assert summarize(steps)[2] > 0.09 * summarize(steps)[0]


def test_too_few_steps_or_a_pattern_keep_every_step():
    assert split_disturbed([1.9, 1.9, 2.7, 1.9, 1.9]).left_out == []  # five: too few to judge
    # Slow every third step, in any phase: six steps hold two slow ones.
    for phase in range(3):
        assert split_disturbed([2.7 if (i + phase) % 3 == 0 else 1.9 for i in range(6)]).left_out == []
    # Slow every third or fourth step: the job's own pattern, more often than one in eight.
    assert split_disturbed([1.9, 1.9, 2.7, 1.9, 1.9, 2.7, 1.9, 1.9]).left_out == []
    assert split_disturbed([1.9, 2.7, 1.9, 1.9, 1.9, 2.7, 1.9, 1.9, 1.9, 2.7, 1.9, 1.9]).left_out == []
    # From 16 steps on, two may go.
    sixteen = [1.9] * 14 + [2.7, 2.8]
    assert sorted(split_disturbed(sixteen).left_out) == [2.7, 2.8]
    assert split_disturbed([]).kept == [] and split_disturbed([2.0]).kept == [2.0]


def test_a_noisy_job_is_judged_by_its_own_spread():
    # Steps that vary by 15% (sequence lengths, say): 30% above the median is not a disturbance.
    steps = [1.0, 1.2, 0.85, 1.1, 0.95, 1.3, 1.05, 0.9]
    assert split_disturbed(steps).left_out == []


def test_undisturbed_steps_are_almost_never_trimmed_and_intervals_stay_95_percent():
    # Steps varying by 5% around 2.0 s, one in 30 disturbed by 35-47%: the figure from the kept
    # steps covers the undisturbed mean at least 95% of the time, and measurements with no
    # disturbance almost never lose a step (which would bias the mean fast).
    rng = random.Random(11)
    covered = trimmed_clean = clean = 0
    runs = 4000
    for _ in range(runs):
        steps, disturbed = [], False
        for _ in range(8):
            x = rng.gauss(2.0, 0.1)
            if rng.random() < 1 / 30:
                x, disturbed = x * rng.uniform(1.35, 1.47), True
            steps.append(x)
        split = split_disturbed(steps)
        mean, _, ci = summarize(split.kept)
        covered += abs(mean - 2.0) <= ci
        if not disturbed:
            clean += 1
            trimmed_clean += bool(split.left_out)
    assert covered / runs >= 0.94
    assert trimmed_clean / clean < 0.005
