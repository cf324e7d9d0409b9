"""When a trial's warm-up ends: when its step times have settled."""

from __future__ import annotations

import statistics

from ..trials import MEASURE_DEFAULTS

WARMING = 0.05
"""Warm-up ends at the first step time not more than this fraction slower than the median of the
steps after it: a job still warming up gets faster step by step (caches, the allocator, thread
pools), and timing a step that is still warming reads the trial slow, with an interval that
narrows late. Judged against the median of all the later steps rather than the next one alone,
so that one noisy step does not keep a settled job warming up (tests/test_probe.py holds the
step sequences)."""


def settled_at(times: list[float], limit: int = MEASURE_DEFAULTS.max_warmup_steps) -> int | None:
    """Adaptive warm-up: how many of ``times`` come before the first timed step's end, given when
    each step ended (and, where step 1 may be timed, first when it began; see
    StepProbe.marks). Warm-up ends at the first step whose time is not more than WARMING slower
    than the median of the step times after it, timed from there: without that first mark, step
    1 (one-time costs: compilation, caches, the allocator) has no time and always warms up. None
    while nothing has settled yet (and fewer than ``limit`` steps ran: after that many, timing
    starts settled or not, and the interval shows it; MeasureSettings.max_warmup_steps). Step
    times alone decide: a rule on the heap's growth (minor page faults, which StepProbe still
    reports per step) would only decide a step later, and a step of warm-up costs a whole step.
    """
    durations = [b - a for a, b in zip(times, times[1:])]
    for i in range(len(durations) - 1):
        if durations[i] * (1 - WARMING) <= statistics.median(durations[i + 1 :]):
            return i + 1
        if i + 1 >= limit:
            return limit
    return None
