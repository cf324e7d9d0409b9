"""The t quantiles behind every interval: exact at whole degrees of freedom, just above the true
quantile between them (Welch-Satterthwaite's fractions) and beyond the table."""
import math
import random
import statistics

from zerotune.step_stats import t95_df, welch_df


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
