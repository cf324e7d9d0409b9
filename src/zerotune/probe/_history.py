"""What a warm process's earlier trials leave for its later ones, so that a later trial's step 1
can be timed: the forward FLOPs they profiled, the most memory any of them held, and the ZeRO
setups they ran.

DeepSpeed's flops profiler hooks every module for one forward, so the step it runs in cannot be
timed. A cold process profiles step 1, which is warm-up anyway (one-time costs). In a warm
process a later trial's step 1 is as fast as its others (within 2%, the flops profiler on or off
alike), so it can be timed, saving each such trial a step, where it need not profile. It need
not: what a forward costs per sample depends on the model and the sample, not on the micro-batch
(a linear layer, an attention product and a convolution are all linear in the batch), nor on
ZeRO stages 0-2, which run the same forward (the bundled example counted 1312542720 FLOPs a
sample at micro-batches 8, 16 and 32 and stages 0, 1 and 2 alike). ZeRO-3 runs its own: the
profiler counts twice as much there. So a trial of the same program (script, its arguments but
for the trial's files, the same parameter count and sample shape, ZeRO-3 or not) takes the
figure per sample an earlier trial profiled in this process, scaled to its own batch, and says so.

Except where step 1 needed more memory than any earlier trial of the process held: its first
two steps fault their pages in for the first time and run alike and slow (16% slower than the
rest on the bundled example). Two equal slow steps look settled, and would stop the trial early
as slow; such a step 1 warms up, and the rule for later steps judges its step 2.

And except where the process had not yet run an engine of the trial's ZeRO setup (its stage,
and whether it offloads): the first trial of a new stage after others runs step 2 12-39% slower
than step 1 and step 3 (tests/test_probe_first_step.py holds such sequences), while later trials
of a stage the process has run show none. Timed from step 1, that one slow step widens a trial of
three steps to about ±28%, within noise of a leader it trails, and sends the search and the
confirmation after configs that cannot win. Its step 1 warms up instead, so the warm-up rule judges step 2 against the steps after it.
"""

from __future__ import annotations

import os
from typing import Any

GREW = 0.01
"""A trial's peak above the process's earlier high-water mark by more than this fraction needed
memory none of them did."""


class ProcessHistory:
    """Per warm process: forward FLOPs per sample profiled, by what they depend on (see flops_key),
    the highest peak memory (RSS) of its trials so far, and the ZeRO setups they ran."""

    def __init__(self) -> None:
        self._flops: dict[tuple, tuple[float, int]] = {}
        self.high_water = 0
        """The highest peak RSS of this process's trials so far (0 before the first ends)."""
        self._setups: set[tuple] = set()
        """The ZeRO setups (see zero_setup) of the engines this process's trials ran."""

    @staticmethod
    def flops_key(
        spec: dict[str, Any], sample_shape: tuple[int, ...], dtype: str, num_params: int, zero3: bool
    ) -> tuple:
        """What a forward's profiled cost per sample depends on: the program and its arguments (a
        value naming a file in the results folder, a trial's ds_config, read as the same), the
        model's size, one sample's shape and type, and whether ZeRO-3 runs the forward."""
        own = str(spec.get("results_dir") or spec["out_dir"]).rstrip(os.sep)

        def same(value: Any) -> str:
            # A path in the folder, alone or as an option's value (--deepspeed_config=PATH); not
            # a name that merely starts like it (/tmp/r against /tmp/rabbit.txt).
            text = str(value)
            return "<results file>" if own + os.sep in text else text

        env = sorted((k, same(v)) for k, v in (spec.get("env") or {}).items())
        return (
            spec["script"],
            tuple(same(a) for a in spec.get("args") or []),
            same(spec.get("lightning_config")),
            tuple(env),
            tuple(sample_shape),
            dtype,
            num_params,
            zero3,
        )

    def flops(self, key: tuple) -> tuple[float, int] | None:
        """(forward FLOPs per sample, the batch they were profiled at), or None if never profiled."""
        return self._flops.get(key)

    def profiled(self, key: tuple, fwd_flops: float, batch: int) -> None:
        if batch > 0 and fwd_flops > 0:
            self._flops[key] = (fwd_flops / batch, batch)

    def grew(self, peak: int) -> bool:
        """``peak`` (RSS) is above what any earlier trial of this process held (see GREW)."""
        return peak > self.high_water * (1 + GREW)

    def ended(self, peak: int) -> None:
        """A trial of this process ended with this peak RSS."""
        self.high_water = max(self.high_water, peak)

    def new_setup(self, setup: tuple) -> bool:
        """No earlier trial of this process ran an engine of this ZeRO setup (see zero_setup)."""
        return setup not in self._setups

    def ran(self, setup: tuple) -> None:
        """A trial of this process ran an engine of this ZeRO setup."""
        self._setups.add(setup)


def zero_setup(engine: Any) -> tuple:
    """What a DeepSpeed engine's buffers and code paths depend on besides the batch: its ZeRO
    stage, and whether it offloads the optimizer states and the parameters."""

    def offloads(name: str) -> bool:
        method = getattr(engine, name, None)
        return callable(method) and method() is not None

    return (engine.zero_optimization_stage(), offloads("zero_offload_optimizer"), offloads("zero_offload_param"))
