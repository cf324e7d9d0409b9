"""When a trial's warm-up ends: step times that have settled, and on CPU a heap that has stopped growing."""
from __future__ import annotations

import statistics

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
MAX_WARMUP = 10
"""Steps after which timing starts even if step times never settled (the interval then shows it)."""
FAULTS_GROWING = 1.5
"""On CPU a step still warms up while it takes more than this many times the minor page faults
of the median step after it, plus FAULTS_FLOOR: the process is still growing its heap, and its
time is not yet the job's. (The bundled example's first engine at micro-batch 8 faulted 71k, 44k
and 12k pages in its first steps, then 0-24k; its steps ran 2.37, 2.53 and 2.43 s, then
2.11-2.22 s. At micro-batch 32 every step faults 97-138k pages, tensors above the fixed mmap
threshold mapped afresh: a steady cost, which the median of the later steps holds too.)"""
FAULTS_FLOOR = 16384
"""Page faults (64 MB of 4 KiB pages) a step may take beyond FAULTS_GROWING times the later
steps' and still count as settled: the steady steps of a small job fault a few thousand pages
either way."""


def heap_growing(faults: list[int], i: int) -> bool:
    """Whether step ``i`` (between marks i and i+1) faulted clearly more pages than the median of
    the steps after it. ``faults``: the process's minor page faults at each mark."""
    steps = [b - a for a, b in zip(faults, faults[1:])]
    return steps[i] > FAULTS_GROWING * statistics.median(steps[i + 1:]) + FAULTS_FLOOR


def settled_at(times: list[float], limit: int = MAX_WARMUP, faults: list[int] | None = None) -> int | None:
    """Adaptive warm-up: how many of ``times`` come before the first timed step's end, given when
    each step ended (and, where step 1 may be timed, first when it began; see
    StepProbe.marks). Warm-up ends at the first step whose time is not more than WARMING slower
    than the median of the step times after it, timed from there: without that first mark, step
    1 (one-time costs: compilation, caches, the allocator) has no time and always warms up. Where
    ``faults`` (minor page faults at each of ``times``, a CPU process's) are given, neither that
    step nor the first timed one may still be growing the heap (heap_growing): the first timed
    step is judged against those after it too, so this waits a step longer, which costs no step
    (a measurement needs two timed steps anyway). None while nothing has settled yet (and fewer
    than ``limit`` steps ran)."""
    assert faults is None or len(faults) == len(times), "one fault count per mark"
    durations = [b - a for a, b in zip(times, times[1:])]
    for i in range(len(durations) - 1):
        if durations[i] * (1 - WARMING) <= statistics.median(durations[i + 1:]):
            if not faults:
                return i + 1
            if i + 2 < len(durations) and not heap_growing(faults, i) and not heap_growing(faults, i + 1):
                return i + 1
        if i + 1 >= limit:
            return limit
    return None
