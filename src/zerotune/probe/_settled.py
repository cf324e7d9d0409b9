"""When a trial's warm-up ends: when its step times have settled."""

from __future__ import annotations

import statistics

from ..settings import MEASURE_DEFAULTS

WARMING = 0.05
"""Warm-up ends at the first step time not more than this fraction slower than the median of the
steps after it: a job still warming up gets faster step by step (caches, the allocator, thread
pools). (A fresh process's steps ran 1.82, 1.60, 1.48, 1.45, 1.52 s: timing from the 1.60 s step
read the trial 3% slow, with an interval that never reached 3% in 10 steps; from 1.48 s it
settles in 4.) Judged against the median of all the later steps rather than the next one alone,
so that one noisy step does not keep a settled job warming up: at 6-10% step noise the rule of
two consecutive steps (within 15%, the second not 5% faster) ran z2_mb32_gas1's steps 3.29,
2.80, 2.44, 3.08, 2.81 s all as warm-up in run 31-2, 14 s of a trial then stopped early after two
timed steps."""


def settled_at(times: list[float], limit: int = MEASURE_DEFAULTS.max_warmup_steps) -> int | None:
    """Adaptive warm-up: how many of ``times`` come before the first timed step's end, given when
    each step ended (and, where step 1 may be timed, first when it began; see
    StepProbe.marks). Warm-up ends at the first step whose time is not more than WARMING slower
    than the median of the step times after it, timed from there: without that first mark, step
    1 (one-time costs: compilation, caches, the allocator) has no time and always warms up. None
    while nothing has settled yet (and fewer than ``limit`` steps ran: after that many, timing
    starts settled or not, and the interval shows it; MeasureSettings.max_warmup_steps). Step times alone: in the 28
    trials of three bench runs, no step at a warm-up's end grew the heap (its minor page faults,
    which StepProbe reports, within 1.5 times the later steps' median and 64 MB), so a rule on
    them changed nothing, except by waiting a step longer to decide, which cost three losing
    trials 3-4 s each (README, runs at stop 41)."""
    durations = [b - a for a, b in zip(times, times[1:])]
    for i in range(len(durations) - 1):
        if durations[i] * (1 - WARMING) <= statistics.median(durations[i + 1 :]):
            return i + 1
        if i + 1 >= limit:
            return limit
    return None
