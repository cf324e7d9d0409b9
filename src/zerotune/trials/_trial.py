"""What a trial is (spec), how it ended (state) and what it measured (result)."""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ._step_stats import t95_df

TO_BEAT_FILE = "to_beat.json"
"""In a running trial's folder: the best figure found since it started (TrialJob.to_beat's
form), written by the tuner and read by the probe at each step, so that a trial started before
the leader was known may stop early against it too."""


class TrialState(str, enum.Enum):
    OK = "ok"
    OOM = "oom"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    PRUNED = "pruned"
    """Never launched: predicted not to fit, or invalid for the user's settings."""
    KILLED = "killed"
    """A rank was killed from outside zerotune (not by the kernel for memory), or a node of the
    trial failed: no verdict on the configuration; a rerun measures it again."""


SHORT_KEYS = {
    "zero_optimization.offload_optimizer.device": "oo",
    "zero_optimization.offload_param.device": "op",
    "zero_force_ds_cpu_optimizer": None,
    "zero_optimization.reduce_bucket_size": "rbs",
    "zero_optimization.allgather_bucket_size": "abs",
    "zero_optimization.overlap_comm": "oc",
    "zero_optimization.reduce_scatter": "rs",
    "zero_optimization.contiguous_gradients": "cg",
    "zero_optimization.allgather_partitions": "ap",
    "zero_optimization.stage3_prefetch_bucket_size": "pf",
    "zero_optimization.stage3_param_persistence_threshold": "pt",
    "zero_optimization.stage3_max_live_parameters": "ml",
    "zero_optimization.stage3_max_reuse_distance": "mr",
    "zero_optimization.sub_group_size": "sg",
    "fsdp.offload": "off",
    "fsdp.sync_each_batch": "sync",
}
"""Short names of override keys in trial names; None: implied by the others, not named."""


def short_value(value: Any) -> str:
    """A value as trial names show it: 5e8 for 500000000.0, on/off for booleans."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)) and abs(value) >= 1e4:
        mantissa, exp = f"{float(value):.12e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_SAFE = re.compile(r"[A-Za-z0-9.+-]+")
_NAMED_VALUES = ("none", "cpu", "nvme")
"""String values a short-named key may show as they are (offload devices)."""
MAX_NAME = 96


def _slug(text: str, limit: int = 24) -> str:
    """``text`` in the characters a folder name may hold everywhere, at most ``limit`` long."""
    return "-".join(_SAFE.findall(text))[:limit] or "x"


ENGINES = ("deepspeed", "fsdp")
"""The engines a trial trains with: DeepSpeed ZeRO, or PyTorch FSDP2 (``fully_shard``)."""
FSDP_STAGES = {3: "reshard", 2: "keep"}
"""An FSDP2 trial's ``stage``: 3 reshards the parameters after forward (each rank holds its shard
between the passes, as ZeRO-3), 2 keeps them gathered until backward (as ZeRO-2 keeps whole
parameters); both shard gradients and optimizer states. Its name says ``fsdp-reshard`` or
``fsdp-keep``."""


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    """One configuration to measure: an engine, its ZeRO stage (for FSDP2, see FSDP_STAGES), a
    micro-batch and accumulation, and any further overrides (dotted ds_config keys, or
    ``fsdp.*`` for an FSDP2 trial)."""

    stage: int
    micro_batch: int
    grad_accum: int = 1
    overrides: tuple[tuple[str, Any], ...] = ()
    engine: str = "deepspeed"

    def __post_init__(self) -> None:
        assert self.engine in ENGINES, f"unknown engine {self.engine!r}"
        assert self.engine != "fsdp" or self.stage in FSDP_STAGES, f"FSDP2 has no stage {self.stage}"

    @property
    def setting(self) -> str:
        """The engine and stage in the summary's words: ``ZeRO-2``, ``FSDP2 reshard``."""
        return f"ZeRO-{self.stage}" if self.engine == "deepspeed" else f"FSDP2 {FSDP_STAGES[self.stage]}"

    @property
    def name(self) -> str:
        """Canonical, short and stable: the trial's folder name. Only letters, digits and
        ``.+-=_`` (never a path separator, never hidden); where the readable part does not say
        the spec exactly (a user's key, a string value, a long name) a short hash of the whole
        spec follows, so that two specs never share a folder."""
        head = f"z{self.stage}" if self.engine == "deepspeed" else f"fsdp-{FSDP_STAGES[self.stage]}"
        parts = [head, f"mb{self.micro_batch}", f"gas{self.grad_accum}"]
        exact = True
        for key, value in self.overrides:
            short = SHORT_KEYS.get(key, "")
            if short is None:
                continue
            text = short_value(value)
            if (
                not short
                or not (isinstance(value, (bool, int, float)) or value in _NAMED_VALUES)
                or _slug(text) != text
            ):
                exact = False
            parts.append(f"{short or _slug(key.rsplit('.', 1)[-1])}={_slug(text)}")
        name = "_".join(parts)
        if exact and len(name) <= MAX_NAME:
            return name
        digest = hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True, default=repr).encode()).hexdigest()[:8]
        return f"{name[:MAX_NAME]}-{digest}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "overrides": [list(o) for o in self.overrides],
            **({"engine": self.engine} if self.engine != "deepspeed" else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialSpec:
        """A spec read back from disk; ValueError when it is not one zerotune wrote."""
        if not isinstance(d, dict):
            raise ValueError("spec is not an object")
        stage, mb, gas = d.get("stage"), d.get("micro_batch"), d.get("grad_accum", 1)
        engine = d.get("engine", "deepspeed")
        if engine not in ENGINES:
            raise ValueError(f"spec has an unknown engine {engine!r}")
        valid_stage = isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3
        valid_stage = valid_stage and (engine != "fsdp" or stage in FSDP_STAGES)
        if not valid_stage or not _count(mb) or not _count(gas):
            raise ValueError(f"spec has no valid stage, micro_batch and grad_accum ({stage!r}, {mb!r}, {gas!r})")
        overrides = d.get("overrides", ())
        if not isinstance(overrides, list) or not all(
            isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) for o in overrides
        ):
            raise ValueError("spec overrides are not [key, value] pairs")
        return cls(
            stage=stage, micro_batch=mb, grad_accum=gas, overrides=tuple(tuple(o) for o in overrides), engine=engine
        )


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


CI_CEILING = 13.0
"""A step time's 95% half-width is never more than this many times its mean: positive step
times keep the standard error below the mean, and the widest t quantile (one degree of
freedom) is 12.706. Above it, a result file was damaged."""


MAX_STEP_SECONDS = 1e6
"""No optimizer step of a real job takes longer (11 days): a result file saying so was damaged."""


def _measurement_damage(m: dict[str, Any]) -> str:
    """Why the fields of a stored measurement cannot be one ("" where they can): every figure
    read back is later divided, squared or summed, so a wrong type or an absurd size is caught
    here, once, rather than as a traceback in ``zerotune show``."""
    if not (
        _number(m.get("step_time_mean"), positive=True)
        and _count(m.get("samples_per_step"))
        and _number(m.get("step_time_ci95"))
        and _number(m.get("step_time_std"))
        and _number(m.get("timed_seconds", 0.0))
        and all(m.get(k) is None or _number(m.get(k), positive=True) for k in ("step_time_df", "lost_to"))
    ):
        return "measurement has no positive step time and sample count, or a damaged interval"
    steps = m.get("steps_measured")
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0):
        return "measurement has no count of timed steps"
    if m.get("tokens_per_sample") is not None and not _count(m.get("tokens_per_sample")):
        return "measurement's tokens per sample is not a count"
    if m.get("flops_per_step") is not None and not _number(m.get("flops_per_step"), positive=True):
        return "measurement's FLOPs per step is not a positive number"
    if not all(isinstance(m.get(k, ""), str) for k in ("flops_note", "lost_to_metric")):
        return "measurement's notes are not text"
    if not all(isinstance(m.get(k, False), bool) for k in ("stable", "early_stop", "tied")):
        return "measurement's stable, early_stop and tied are not true or false"
    left_out = m.get("left_out", [])
    if not (
        isinstance(left_out, list)
        and all(_number(v, positive=True) and v <= MAX_STEP_SECONDS for v in left_out)
        and (m.get("left_out_median") is None or _number(m.get("left_out_median"), positive=True))
        and m.get("left_out_unit", "step") in ("step", "micro-step")
    ):
        return "measurement's steps left out as disturbances are not a list of step times"
    mean = m["step_time_mean"]
    # Positive step times keep the standard deviation below mean x sqrt(n) and the standard
    # error below the mean: see CI_CEILING.
    if (
        mean > MAX_STEP_SECONDS
        or m["step_time_ci95"] > CI_CEILING * mean
        or m["step_time_std"] > mean * math.sqrt(max(1, steps))
    ):
        return "measurement has a step time or an interval no measurement can have"
    return ""


def _number(v: Any, *, positive: bool = False) -> bool:
    return (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    )


@dataclass(kw_only=True)
class Measurement:
    """End-to-end timing of optimizer steps, aggregated over ranks by the launcher."""

    samples_per_step: int
    step_time_mean: float
    step_time_std: float
    step_time_ci95: float
    """Half-width of the 95% interval of the mean step time, in seconds."""
    steps_measured: int
    stable: bool
    tokens_per_sample: int | None = None
    flops_per_step: float | None = None
    """Model FLOPs of one optimizer step on one rank (DeepSpeed's flops profiler), or None."""
    flops_note: str = ""
    early_stop: bool = False
    """Measuring stopped once the trial clearly could not beat the best so far."""
    lost_to: float | None = None
    """With early_stop: the best trial's figure it was shown (one-sided, at 95%) unable to beat,
    in lost_to_metric; None where unknown."""
    lost_to_metric: str = ""
    tied: bool = False
    """Measuring stopped behind the best so far, not shown unable to beat it, with too few steps
    left before the time cap to show that: a tie, for the confirmation to measure again."""
    timed_seconds: float = 0.0
    """Seconds of the timed steps: the measurement itself, of the trial's wall time."""
    step_time_df: float | None = None
    """Degrees of freedom of step_time_ci95's t quantile (steps_measured - 1 for whole steps; fewer
    or more for an estimate from micro-steps); None where unknown (then see standard_error)."""
    left_out: list[float] = field(default_factory=list)
    """Seconds of each timed sample left out of the figure as a disturbance (see
    step_stats.split_disturbed): whole steps, or micro-steps where left_out_unit says so. The
    steps stay in steps_measured and timed_seconds; the mean and interval are of the rest."""
    left_out_median: float | None = None
    """The median of the samples those were judged against."""
    left_out_unit: str = "step"
    """What left_out holds: "step" (whole optimizer steps) or "micro-step"."""

    @property
    def standard_error(self) -> tuple[float, float]:
        """The step time's standard error and its degrees of freedom, read back from the 95%
        interval: what comparing or combining measurements needs. Where the degrees of freedom
        are unknown (results of older versions), steps_measured - 1, the whole-step count's."""
        df = self.step_time_df if self.step_time_df is not None else self.steps_measured - 1.0
        t = t95_df(df)
        return (self.step_time_ci95 / t if math.isfinite(t) else math.inf), df

    @property
    def throughput(self) -> float:
        return self.samples_per_step / self.step_time_mean

    @property
    def throughput_ci95(self) -> float:
        """Half-width of the 95% interval of the throughput (first-order propagation)."""
        return self.throughput * self.step_time_ci95 / self.step_time_mean

    @property
    def flops(self) -> float | None:
        return None if self.flops_per_step is None else self.flops_per_step / self.step_time_mean


@dataclass(kw_only=True)
class TrialResult:
    """A finished trial: its spec, final state, why (for anything but ok) and measurements."""

    spec: TrialSpec
    state: TrialState
    reason: str = ""
    measurement: Measurement | None = None
    peak_memory: list[int] = field(default_factory=list)
    """Per-rank peak memory in bytes: device max reserved on GPU, peak RSS on CPU."""
    peak_allocated: list[int] = field(default_factory=list)
    """Per-rank peak of allocated device memory (GPU); equals peak_memory on CPU."""
    static_memory: list[int] = field(default_factory=list)
    """Per-rank memory in use before the first forward (model states after initialize)."""
    memory_kind: str = ""
    num_params: int | None = None
    wall_time: float = 0.0
    budget: int | None = None
    start: str = ""
    """How its processes started: "cold" (a launch of its own, with why where warm trials were
    asked for), "warm (trial N of its processes)", or "" (not launched: pruned, or older)."""
    retired: str = ""
    """Why the warm processes that ran it were ended after it ("" when they served on)."""
    predicted: float | None = None
    """Samples/s the throughput model predicted before it ran (or pruned it); None: no prediction."""
    losses: list[float] = field(default_factory=list)
    """The mean loss in each of the first optimizer steps over all ranks, where the probe reads it
    (the model's forward returns it): the engines' agreement is read from these."""

    @property
    def warm(self) -> bool:
        return self.start.startswith("warm")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def max_peak(self) -> int | None:
        return max(self.peak_memory) if self.peak_memory else None

    def metric(self, metric: str) -> float | None:
        """The value of ``metric`` (throughput: samples/s; latency: s per step; flops: FLOP/s)."""
        m = self.measurement
        if self.state is not TrialState.OK or m is None:
            return None
        return {"throughput": m.throughput, "latency": m.step_time_mean, "flops": m.flops}[metric]

    def metric_ci(self, metric: str) -> float | None:
        m = self.measurement
        if m is None:
            return None
        if metric == "latency":
            return m.step_time_ci95
        if metric == "flops":
            return None if m.flops is None else m.flops * m.step_time_ci95 / m.step_time_mean
        return m.throughput_ci95

    def to_dict(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "spec": self.spec.to_dict(),
            "state": self.state.value,
            "reason": self.reason,
            "measurement": asdict(self.measurement) if self.measurement else None,
            "peak_memory": self.peak_memory,
            "peak_allocated": self.peak_allocated,
            "static_memory": self.static_memory,
            "memory_kind": self.memory_kind,
            "num_params": self.num_params,
            "wall_time": self.wall_time,
            "budget": self.budget,
            "start": self.start,
            "retired": self.retired,
            "predicted": self.predicted,
            "losses": self.losses,
        }
        m = self.measurement
        if m:
            d.update(
                {
                    "throughput": m.throughput,
                    "throughput_ci95": m.throughput_ci95,
                    "latency": m.step_time_mean,
                    "latency_ci95": m.step_time_ci95,
                    "tokens_per_second": m.throughput * m.tokens_per_sample if m.tokens_per_sample else None,
                    "flops": m.flops if m.flops is not None else "unavailable: " + (m.flops_note or "not measured"),
                }
            )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        """A result read back from disk; ValueError (or TypeError) when it is damaged."""
        if not isinstance(d, dict):
            raise ValueError("result is not an object")
        m = d.get("measurement")
        if m is not None:
            if not isinstance(m, dict):
                raise ValueError("measurement is not an object")
            m = {k: v for k, v in m.items() if k in Measurement.__dataclass_fields__}
            if why := _measurement_damage(m):
                raise ValueError(why)
        for key in ("peak_memory", "peak_allocated", "static_memory"):
            if not isinstance(d.get(key, []), list) or not all(_number(v) for v in d.get(key, [])):
                raise ValueError(f"{key} is not a list of byte counts")
        if d.get("predicted") is not None and not _number(d.get("predicted"), positive=True):
            raise ValueError("predicted is not a positive number")
        for key in ("reason", "start", "retired"):
            if not isinstance(d.get(key, ""), str):
                raise ValueError(f"{key} is not text")
        if not _number(d.get("wall_time", 0.0)):
            raise ValueError("wall_time is not a number of seconds")
        losses = d.get("losses", [])
        if not isinstance(losses, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in losses
        ):
            raise ValueError("losses is not a list of numbers")
        return cls(
            spec=TrialSpec.from_dict(d.get("spec")),
            state=TrialState(d.get("state")),
            reason=d.get("reason", ""),
            measurement=Measurement(**m) if m else None,
            peak_memory=d.get("peak_memory", []),
            peak_allocated=d.get("peak_allocated", []),
            static_memory=d.get("static_memory", []),
            memory_kind=d.get("memory_kind", ""),
            num_params=d.get("num_params"),
            wall_time=d.get("wall_time", 0.0),
            budget=d.get("budget"),
            start=d.get("start", ""),
            retired=d.get("retired", ""),
            predicted=d.get("predicted"),
            losses=[float(v) for v in losses],
        )
