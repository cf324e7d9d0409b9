"""Hooks on DeepSpeed's engine that time optimizer steps and stop the trial when measured."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from .._files import write_json
from ..trials import (
    MICRO_STEPS_FROM,
    TO_BEAT_FILE,
    Figure,
    Samples,
    estimate_is_stable,
    is_stable,
    settle_verdict,
    slower_beyond,
    split_disturbed,
    step_estimate,
    step_estimate_df,
    summarize,
    t95_df,
)
from ._history import ProcessHistory, zero_setup
from ._memory import MemoryReader, minor_faults
from ._settled import settled_at

LOSS_STEPS = 4
"""Optimizer steps whose mean loss a trial records: the engines' agreement is read from them."""


def loss_of(out: Any) -> float | None:
    """The loss a forward returned: a one-element tensor, or the ``loss`` of a model output."""
    import torch

    loss = out if isinstance(out, torch.Tensor) else getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return float(loss.detach().float().item())
    return None


def count_params(engine) -> int:
    """The model's parameters (ZeRO-3's partitioned ones at their whole size)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in engine.module.parameters())


def _first_tensor(args, kwargs, torch):
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
        if isinstance(value, dict):
            for v in value.values():
                if isinstance(v, torch.Tensor):
                    return v
    return None


class TrialStop(BaseException):
    """Ends the user's script in a warm process at the step where the trial is measured (a cold
    process ends with ``os._exit`` instead). A BaseException, so that ``except Exception`` in the
    script lets it through; ``code`` 0 is a clean stop."""

    def __init__(self, code: int):
        super().__init__(f"zerotune ended the trial here (status {code})")
        self.code = code


class StepProbe:
    """Lives in every rank. Rank 0 decides when to stop; an all-reduce makes every rank agree,
    so all of them leave at the same optimizer step and none waits in a collective. ``warm``:
    the process serves further trials, so the probe stops the script by raising
    :class:`TrialStop` rather than ending the process."""

    def __init__(self, spec: dict[str, Any], rank: int, *, warm: bool = False, history: ProcessHistory | None = None):
        import torch

        self.torch = torch
        self.spec = spec
        self.rank = rank
        self.warm = warm
        self.finished: tuple[str, int] | None = None
        """(state, exit status) once this rank's result is written."""
        self.engines: weakref.WeakSet = weakref.WeakSet()
        """Every DeepSpeed engine built during the trial: a warm process checks that none outlives it."""
        self.out = Path(spec["out_dir"])
        self.model_params: int | None = None
        """The model's parameter count, taken as the engine is built (see install)."""
        self._leader_stamp: int | None = None
        """When TO_BEAT_FILE was last read (its mtime), so each step reads it only when it changed."""
        self.times: list[float] = []
        """When each optimizer step (gradient-accumulation boundary) ended."""
        self.faults: list[int] = []
        """This process's minor page faults at each of ``times``: reported per step, what a CPU
        heap still growing, or refaulting large tensors each step, would show."""
        self.ready: float | None = None
        """When the engine was built, where step 1 is timed from (see marks); None where step 1
        is warm-up whatever its time: a cold process's (one-time costs, and its flops profile)."""
        self.ready_faults = 0
        """The minor page faults when ``ready`` was read."""
        self.history = history
        """What this warm process's earlier trials left (see ProcessHistory); None: a cold
        process, which profiles and never times step 1."""
        self._flops_key: tuple | None = None
        self.micro_ends: list[tuple[float, bool]] = []
        """When each micro-step (forward, backward, engine.step) ended, and whether it was a boundary."""
        self.static_memory: int | None = None
        self.tokens_per_sample: int | None = None
        self.observed_batch: int | None = None
        self.fwd_flops: float | None = None
        self.flops_note = "not profiled"
        self.early_stop = False
        self.tied = False
        """Ended behind the best so far, the steps its time cap left unable to show it slower (see _tied)."""
        self.batch_note = ""
        self.losses: list[float] = []
        """This rank's mean loss in each of the first LOSS_STEPS optimizer steps (see saw_output)."""
        self._step_losses: list[float] = []
        self.memory: MemoryReader | None = None
        self.engine = None
        self._warmup: int | None = None
        self.start = time.perf_counter()
        self.heartbeat = self.out / f"rank{rank}.progress"

    def beat(self) -> None:
        """Progress for the launcher's hang check: forwards and optimizer steps done, and the
        longest step so far (a slow model's limit grows with it)."""
        longest = max((b - a for a, b in zip(self.times, self.times[1:])), default=0.0)
        try:
            self.heartbeat.write_text(f"{len(self.times)} {longest:.3f}\n")
        except OSError:
            pass  # never fail a trial over its heartbeat

    # -- hooks -------------------------------------------------------------------------------
    def before_forward(self, engine, args, kwargs) -> bool:
        """Returns True when this forward should be profiled for FLOPs."""
        self.beat()
        if self.engine is None:
            self.engine = engine
            self.memory = MemoryReader(
                engine.device.type if hasattr(engine.device, "type") else str(engine.device).split(":")[0], self.torch
            )
            self.static_memory = self.memory.current()
            if self.memory.kind != "cpu-rss":
                self.ready = None  # each trial empties the device's cache: step 1 fills it again
            tensor = _first_tensor(args, kwargs, self.torch)
            if tensor is not None and tensor.dim() >= 1:
                self.observed_batch = int(tensor.shape[0])
                if tensor.dim() == 2 and not tensor.is_floating_point():
                    self.tokens_per_sample = int(tensor.shape[1])
                if self.history is not None:
                    self._flops_key = ProcessHistory.flops_key(
                        self.spec,
                        tuple(tensor.shape[1:]),
                        str(tensor.dtype),
                        count_params(engine),
                        zero3=engine.zero_optimization_stage() == 3,
                    )
            self._carry_flops()
        # Profile one forward during warm-up (the second optimizer step when there are two fixed
        # warm-up steps, else the first, which is then warm-up), never in a timed step.
        first = 0 if self.spec.get("adaptive_warmup") else min(1, self.spec["warmup_steps"] - 1)
        profile = (
            self.spec.get("profile_flops", True) and self.flops_note == "not profiled" and len(self.times) == first
        )
        if profile:
            self.ready = None  # a profiled step is never timed: step 1 warms up (see marks)
        return profile

    def _carry_flops(self) -> None:
        """Take this program's forward FLOPs from an earlier trial of this process where it has
        them (see ProcessHistory), so that step 1 runs unprofiled and may be timed."""
        if (
            self._flops_key is None
            or self.history is None
            or not self.spec.get("profile_flops", True)
            or not self.spec.get("adaptive_warmup")
        ):
            return
        known = self.history.flops(self._flops_key)
        if known is None or not self.observed_batch:
            return
        per_sample, batch = known
        self.fwd_flops = per_sample * self.observed_batch
        self.flops_note = (
            f"3 x forward FLOPs from DeepSpeed's flops profiler, per sample as an earlier trial "
            f"in these processes profiled them (batch {batch})"
        )

    def profiled(self, fwd_flops: float) -> None:
        """The flops profiler's count of this trial's profiled forward."""
        self.fwd_flops = fwd_flops
        self.flops_note = "3 x forward FLOPs from DeepSpeed's flops profiler"
        if self.history is not None and self._flops_key is not None and self.observed_batch:
            self.history.profiled(self._flops_key, fwd_flops, self.observed_batch)

    def engine_built(self) -> None:
        """A DeepSpeed engine finished building: step 1 of a warm process's later trial may be
        timed from here (see marks). The last engine built before the first step counts."""
        if not self.times and self.history is not None and self.spec.get("adaptive_warmup"):
            self.ready, self.ready_faults = time.perf_counter(), minor_faults()

    def after_micro(self, engine) -> None:
        """Called after every micro-step that is not a gradient-accumulation boundary."""
        self._sync()
        self.micro_ends.append((time.perf_counter(), False))
        self.beat()

    def saw_output(self, out: Any) -> None:
        """A forward of the trained model returned ``out``: its loss counts toward this step's mean
        (the first LOSS_STEPS steps; averaged over the ranks, the step's whole global batch, the
        same samples whichever way they are split among micro-batches and ranks)."""
        if len(self.losses) < LOSS_STEPS and (loss := loss_of(out)) is not None:
            self._step_losses.append(loss)

    def _sync(self) -> None:
        if self.memory is not None and self.memory.kind == "cuda":
            self.torch.cuda.synchronize()  # time finished work, not queued kernels

    def after_step(self, engine) -> None:
        """Called after every optimizer step (gradient-accumulation boundary)."""
        self._sync()
        now = time.perf_counter()
        if self._step_losses:
            self.losses.append(sum(self._step_losses) / len(self._step_losses))
            self._step_losses = []
        self.times.append(now)
        self.faults.append(minor_faults())
        self.micro_ends.append((now, True))
        self.beat()
        if len(self.times) == 1:
            self._check_config(engine)
            if (
                self.ready is not None
                and self.history is not None
                and self.memory is not None
                and (self.history.grew(self.memory.peak()) or self.history.new_setup(zero_setup(engine)))
            ):
                self.ready = None  # it paid for memory, or a ZeRO setup, no earlier trial had (see ProcessHistory)
        over_budget = self._over_budget()
        if self.rank == 0:
            self._read_leader()
        stop = self.rank == 0 and self._measured_enough()
        flags = self.torch.tensor([float(stop), float(over_budget)], device=self._flag_device())
        if self.torch.distributed.is_initialized():
            self.torch.distributed.all_reduce(flags, op=self.torch.distributed.ReduceOp.MAX)
        stop, any_over = bool(flags[0].item()), bool(flags[1].item())
        if any_over:
            from ..units import format_size

            self.finish(
                "oom",
                f"peak memory {format_size(self.memory.peak())} above the budget of {format_size(self.spec['budget'])}"
                if over_budget
                else "another rank went above the memory budget",
            )
        if stop:
            self.finish("ok", "")

    # -- decisions ---------------------------------------------------------------------------
    def marks(self) -> list[float]:
        """What step times are read from: when each optimizer step ended, after when the engine
        was built where step 1 may be timed (``ready``: a warm process's later trial, with its
        flops carried; its one-time costs were paid by the process's first trial). Timing step 1
        from the build, not from the first forward, counts what a step holds besides the passes
        (the first batch loaded, whatever the script does before its loop): a step 1 so slowed
        warms up under the same rule as any step."""
        return ([self.ready] if self.ready is not None else []) + self.times

    def step_faults(self) -> list[int]:
        """The minor page faults of each step marks() times (read where each of marks() was)."""
        at = ([self.ready_faults] if self.ready is not None else []) + self.faults
        return [b - a for a, b in zip(at, at[1:])]

    def _first_timed(self) -> int:
        """Index into marks() of the first timed step's start."""
        if not self.spec.get("adaptive_warmup"):
            return max(1, self.spec["warmup_steps"])
        marks = self.marks()
        if self._warmup is None:
            self._warmup = settled_at(marks, self.spec["max_warmup"] + (self.ready is not None))
        return self._warmup if self._warmup is not None else max(1, len(marks))

    def warmup(self) -> int:
        """Optimizer steps of warm-up: the fixed count asked for (start_profile_step), or, where
        the user left it, as many as step times need to settle (see settled_at; none where step 1
        is timed and settled); until they have, every step so far."""
        return self._first_timed() - (self.ready is not None)

    def intervals(self) -> list[float]:
        t = self.marks()
        return [t[i] - t[i - 1] for i in range(self._first_timed(), len(t))]

    def timed(self) -> Samples:
        """What the step time is estimated from, with any disturbance left out (split_disturbed):
        whole steps, or the plain micro-steps where the estimate comes from micro-steps (their
        boundaries, one per step, are too few to judge and hold the optimizer step, which is
        slower by design)."""
        return split_disturbed(self.parts()[0] if self.from_micro_steps() else self.intervals())

    def parts(self) -> tuple[list[float], list[float]]:
        """Durations of the plain and the boundary micro-steps after warm-up."""
        warmup, seen, plain, boundary, prev = self.warmup(), 0, [], [], self.ready
        for t, is_boundary in self.micro_ends:
            if seen >= warmup:
                (boundary if is_boundary else plain).append(t - prev)
            seen += is_boundary
            prev = t
        return plain, boundary

    def accumulation(self) -> int:
        return int(self.engine.gradient_accumulation_steps()) if self.engine is not None else 1

    def from_micro_steps(self) -> bool:
        """Whether the step time is estimated from micro-steps (see MICRO_STEPS_FROM)."""
        return self.accumulation() >= MICRO_STEPS_FROM

    def estimate(self) -> tuple[float, float, float]:
        """Mean, standard deviation and 95% half-width of the optimizer step's time: from whole
        steps at low accumulation, from its micro-steps above it (see step_estimate)."""
        if not self.from_micro_steps():
            return summarize(self.timed().kept)
        return step_estimate(self.timed().kept, self.parts()[1], self.accumulation())

    def estimate_df(self) -> float:
        """Degrees of freedom of estimate()'s interval."""
        if not self.from_micro_steps():
            return len(self.timed().kept) - 1.0
        return step_estimate_df(self.timed().kept, self.parts()[1], self.accumulation())

    def fewest_steps(self) -> int:
        """Timed steps a measurement has before it may be called settled or end at its time cap:
        min_steps whole steps (at least two), or two where the step time comes from micro-steps
        (two boundary samples; the plain micro-steps give the rest of its degrees of freedom).
        The cap waits for them: two whole steps of a slow job (one degree of freedom, a t
        quantile of 12.7) would give every trial and re-measurement an interval too wide to
        rank or settle anything. Only an early stop, a one-sided question, may end sooner."""
        return min(2, self.spec["min_steps"]) if self.from_micro_steps() else max(2, self.spec["min_steps"])

    def _stable(self, iv: list[float]) -> bool:
        if not self.from_micro_steps():
            return is_stable(self.timed().kept, min_steps=self.fewest_steps(), rel_ci=self.spec["rel_ci"])
        return estimate_is_stable(
            self.estimate(), whole_steps=len(iv), min_steps=self.fewest_steps(), rel_ci=self.spec["rel_ci"]
        )

    def _measured_enough(self) -> bool:
        iv = self.intervals()
        marks = self.marks()
        measuring = marks[-1] - marks[min(len(marks), self._first_timed()) - 1]
        if self._stable(iv):
            done = True
        elif self._cannot_win(iv):
            self.early_stop = done = True
        else:
            done = len(iv) >= self.spec["max_steps"] or (len(iv) >= self.fewest_steps() and self._at_cap(measuring))
            if not done and self._tied(iv, measuring):
                self.tied = done = True
        settle = self.spec.get("settle")
        if done and settle and not self.early_stop and len(iv) < self.spec["max_steps"]:
            # Measured as long as a trial would be, a re-measurement goes on while more of its steps
            # may answer its comparison, never less: stopping at the first look that settles it
            # would make a wrong "settled" likelier (see settle_target).
            return self._verdict(settle, measuring) != "open"
        return done

    def _at_cap(self, measuring: float) -> bool:
        """Another step, at the mean step time so far, would take the timed steps past the time
        allowed: a re-measurement's window (``window_seconds``), else the cap (``max_seconds``),
        at most that long. (Read after the step that crossed it, the bundled example's first
        trial ran 7 steps of 1.65 s, 11.6 s, against a 10 s cap; now 6.)"""
        mean = self.estimate()[0]
        ahead = mean if math.isfinite(mean) and mean > 0 else 0.0
        return measuring + ahead > (self.spec.get("window_seconds") or self.spec["max_seconds"])

    def _tied(self, iv: list[float], measuring: float) -> bool:
        """Behind the best trial so far (``to_beat``) but not shown unable to beat it, and the
        steps left before the time cap could not show it either, even at its mean and spread so
        far (see _cannot_win): those steps would narrow an interval that decides nothing. The
        trial stays a tie, and ties near the pick are measured again, interleaved, by the
        confirmation, which no window of its own can replace. In a noisy hour the leader's own
        figure is often too wide to stop anything against, and without this every trial within
        noise of it would run to its cap. One ahead of the leader measures on: it becomes the leader,
        and later trials are stopped early or tied against its figure. Asked only from the
        fewest steps a trial may settle on; a re-measurement's comparison is settle's."""
        target = self.spec.get("to_beat")
        if (
            not target
            or self.spec.get("settle")
            or self.engine is None
            or len(iv) < self.fewest_steps()
            or target["metric"] not in ("throughput", "latency")
        ):
            return False
        mean, _, ci = self.estimate()
        if not (math.isfinite(ci) and mean > 0 and target["value"] > 0):
            return False  # no interval yet: nothing to call a tie
        per, lead = self._per_and_lead(target)
        if mean / per <= lead:
            return False  # level or ahead: the next leader, measured in full
        return not self._cannot_win(iv, more=self._steps_left(self.spec["max_seconds"], measuring))

    def _steps_left(self, max_seconds: float, measuring: float) -> float:
        """Samples the measurement may still add before ``max_seconds`` of timed steps (micro-steps
        where the estimate comes from them), at its mean step time so far."""
        mean = self.estimate()[0]
        more = min(self.spec["max_steps"] - len(self.intervals()), (max_seconds - measuring) / mean)
        if self.from_micro_steps():
            more *= self.accumulation()  # each step adds that many samples to the estimate's parts
        return max(0.0, more)

    def _verdict(self, target: dict, measuring: float) -> str:
        """This re-measurement against ``target`` (see settle_verdict; keys as TrialJob.settle's),
        with as many more steps as fit before the cap (``max_seconds``) of timed steps."""
        mean, _, ci = self.estimate()
        df = self.estimate_df()
        t = t95_df(df)
        if not (math.isfinite(ci) and math.isfinite(t) and mean > 0):
            return "out of reach"
        value = target["scale"] / mean if target["maximize"] else mean
        more = self._steps_left(self.spec["max_seconds"], measuring)
        return settle_verdict(Figure(value, value * ci / mean, ci / t / mean, df), target, more=more)

    def _per_and_lead(self, target: dict) -> tuple[float, float]:
        """Samples per step and the leader's time to compare with a step time divided by them:
        per sample for throughput (its reciprocal), per step for latency."""
        if target["metric"] == "throughput":
            return float(self.engine.train_batch_size()), 1 / target["value"]
        return 1.0, target["value"]

    def _cannot_win(self, iv: list[float], more: float = 0.0) -> bool:
        """Even the optimistic end of a one-sided 95% bound loses to the best trial so far (its
        figure with its own standard error, see slower_beyond): more steps would only make a
        losing estimate more precise. One-sided, because the only question is whether it can be
        faster; so two timed steps can already answer it. ``more``: as it would read after that
        many further samples at its mean and spread so far (its standard error shrinking as one
        over the root of the count)."""
        target = self.spec.get("to_beat")
        if not target or len(iv) < 2 or self.engine is None or target["metric"] not in ("throughput", "latency"):
            return False
        mean, _, ci = self.estimate()
        df = self.estimate_df()
        two = t95_df(df)
        if not (math.isfinite(ci) and math.isfinite(two) and mean > 0 and target["value"] > 0):
            return False
        per, lead = self._per_and_lead(target)
        se = ci / two * math.sqrt((df + 1) / (df + 1 + more))
        lead_df = target.get("df")
        return slower_beyond(
            (mean / per, se / per, df + more),
            (lead, lead * (target.get("rel_se") or 0.0), math.inf if lead_df is None else lead_df),
        )

    def _read_leader(self) -> None:
        """The best figure the tuner found since this trial started (TO_BEAT_FILE in its
        folder), which it may now stop early against; a re-measurement answers its own question
        (settle) and reads none."""
        if self.spec.get("settle") is not None:
            return
        path = self.out / TO_BEAT_FILE
        try:
            stamp = path.stat().st_mtime_ns
            if stamp == self._leader_stamp:
                return
            self._leader_stamp = stamp
            target = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # none yet, or unreadable: the trial goes on as it started
        if isinstance(target, dict) and target.get("metric") in ("throughput", "latency") and target.get("value"):
            self.spec["to_beat"] = target

    def _over_budget(self) -> bool:
        budget = self.spec.get("budget")
        return bool(budget) and self.memory is not None and self.memory.peak() > budget

    def _flag_device(self):
        dist = self.torch.distributed
        if dist.is_initialized() and dist.get_backend() == "nccl":
            return self.engine.device
        return "cpu"

    def _check_config(self, engine) -> None:
        expect = self.spec.get("expect") or {}
        got = {
            "stage": engine.zero_optimization_stage(),
            "micro_batch": engine.train_micro_batch_size_per_gpu(),
            "grad_accum": engine.gradient_accumulation_steps(),
        }
        wrong = {k: (v, got[k]) for k, v in expect.items() if k in got and got[k] != v}
        if wrong:
            detail = ", ".join(f"{k} {g} instead of {e}" for k, (e, g) in wrong.items())
            hint = getattr(engine, "config_hint", "pass the --deepspeed_config value through to deepspeed.initialize")
            self.finish("crashed", f"the script did not use the trial's config ({detail}); {hint}", code=4)
        if self.observed_batch is not None and self.observed_batch != got["micro_batch"]:
            self.batch_note = (
                f"the first forward saw batch {self.observed_batch}, not the micro-batch "
                f"{got['micro_batch']}; build the DataLoader with engine.train_micro_batch_size_per_gpu()"
            )

    # -- results -----------------------------------------------------------------------------
    def report(self, state: str, reason: str) -> dict[str, Any]:
        engine = self.engine
        num_params = self.model_params
        samples_per_step = None
        if engine is not None:
            num_params = count_params(engine)
            samples_per_step = engine.train_batch_size()
            gas = engine.gradient_accumulation_steps()
        return {
            "rank": self.rank,
            "state": state,
            "reason": reason,
            "early_stop": self.early_stop,
            "tied": self.tied,
            # The best trial's figure it was shown unable to beat (see _cannot_win).
            "lost_to": self.spec["to_beat"] if self.early_stop else None,
            "times": self.times,
            "intervals": self.intervals(),
            "warmup_steps": self.warmup(),
            # Where step 1 was timed from (see marks); None where it was warm-up.
            "first_step_from": self.ready,
            # Minor page faults of each optimizer step (the first from the build where it is timed).
            "step_faults": self.step_faults(),
            "adaptive_warmup": bool(self.spec.get("adaptive_warmup")),
            # From accumulation MICRO_STEPS_FROM, the step time estimated from its micro-steps; else None
            # (whole steps).
            "estimate": list(self.estimate()) if self.intervals() and self.from_micro_steps() else None,
            "estimate_df": self.estimate_df() if self.intervals() and self.from_micro_steps() else None,
            "micro_steps": dict(zip(("plain", "boundary"), map(len, self.parts()))),
            # Left out of the estimate as disturbances (split_disturbed): micro-steps' durations where
            # the estimate comes from them (whole steps are split again from "intervals").
            "left_out": self.timed().left_out if self.intervals() and self.from_micro_steps() else [],
            "left_out_median": self.timed().median if self.intervals() and self.from_micro_steps() else None,
            "samples_per_step": samples_per_step,
            "tokens_per_sample": self.tokens_per_sample,
            "observed_batch": self.observed_batch,
            "note": self.batch_note,
            "fwd_flops": self.fwd_flops,
            "flops_per_step": None if self.fwd_flops is None or engine is None else 3.0 * self.fwd_flops * gas,
            "flops_note": self.flops_note,
            "static_memory": self.static_memory,
            "memory_kind": self.memory.kind if self.memory else None,
            "peak_memory": self.memory.peak() if self.memory else None,
            "peak_allocated": self.memory.peak_allocated() if self.memory else None,
            "num_params": num_params,
            "elapsed": time.perf_counter() - self.start,
            "losses": self.losses,
        }

    def write(self, state: str, reason: str, code: int = 0) -> None:
        """Record this rank's result (once: what ended the trial first is its result)."""
        if self.finished is not None:
            return
        write_json(self.out / f"rank{self.rank}.json", self.report(state, reason))
        self.finished = (state, code)
        if self.history is not None and self.memory is not None and self.memory.kind == "cpu-rss":
            self.history.ended(self.memory.peak())
        if self.history is not None and self.engine is not None:
            self.history.ran(zero_setup(self.engine))
        sys.stdout.flush()
        sys.stderr.flush()

    def finish(self, state: str, reason: str, code: int = 0) -> None:
        """Record this rank's result and end the script: the process (cold), or the script's run
        in it (warm, by raising TrialStop)."""
        self.write(state, reason, code)
        self.stop()

    def stop(self) -> None:
        assert self.finished is not None, "stop() after write()"
        if self.warm:
            raise TrialStop(self.finished[1])
        os._exit(self.finished[1])


def install(probe: StepProbe) -> None:
    """Wrap DeepSpeedEngine.forward and .step at class level, so every engine (also one that
    Lightning creates) is measured. In a warm process the trial's sandbox puts them back."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    orig_forward, orig_step, orig_init = DeepSpeedEngine.forward, DeepSpeedEngine.step, DeepSpeedEngine.__init__

    def init(self, *args, **kwargs):
        probe.engines.add(self)
        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if probe.model_params is None and hasattr(model, "parameters"):
            # Counted before the engine allocates its states: a config whose states do not fit
            # runs out of memory in there, and its result still tells the parameter count.
            probe.model_params = sum(int(getattr(q, "ds_numel", q.numel())) for q in model.parameters())
        out = orig_init(self, *args, **kwargs)
        probe.engine_built()
        return out

    def forward(self, *args, **kwargs):
        if probe.finished is not None:  # a script that caught the stop and trains on
            probe.stop()
        if not probe.before_forward(self, args, kwargs):
            out = orig_forward(self, *args, **kwargs)
            probe.saw_output(out)
            return out
        try:
            from deepspeed.profiling.flops_profiler import FlopsProfiler

            prof = FlopsProfiler(self.module)
            prof.start_profile()
        except Exception as e:  # the profiler is optional: say why it is missing, never guess
            probe.flops_note = f"flops profiler unavailable: {e}"
            return orig_forward(self, *args, **kwargs)
        try:
            out = orig_forward(self, *args, **kwargs)
            probe.saw_output(out)
            probe.profiled(float(prof.get_total_flops()))
        finally:
            prof.end_profile()
        return out

    def step(self, *args, **kwargs):
        if probe.finished is not None:
            probe.stop()
        boundary = self.is_gradient_accumulation_boundary()
        out = orig_step(self, *args, **kwargs)
        if boundary:
            probe.after_step(self)
        else:
            probe.after_micro(self)
        return out

    DeepSpeedEngine.__init__ = init
    DeepSpeedEngine.forward = forward
    DeepSpeedEngine.step = step
