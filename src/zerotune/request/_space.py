"""Tuning spaces: which ZeRO knobs are searched per stage, their values, and which combinations
are invalid before anything runs.

A dimension is a dotted ds_config key (``zero_optimization.reduce_bucket_size``) or the
micro-batch (``MICRO_BATCH``) with its values. The defaults follow DeepSpeed's autotuner
(``DEFAULT_TUNING_SPACE_ZERO_*``); with ``model_info.hidden_size`` known, bucket sizes centre on
Hugging Face's ``auto`` values (h^2, 0.9 h^2, 10 h). Any key of the user's ds_config whose value is
a list becomes a dimension too, and a key the user set to one value is never searched.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..trials import TrialSpec

MICRO_BATCH = "micro_batch"
ZERO = "zero_optimization"
BUCKETS = (5e7, 5e8, 1e9)
"""DeepSpeed's default values for reduce and allgather bucket sizes."""
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
"""Set per trial by the search (or by the script through arg_mappings), never a dimension."""
LIST_SECTIONS = (
    "optimizer",
    "scheduler",
    "amp",
    "compile",
    "compression_training",
    "data_efficiency",
    "curriculum_learning",
    "sparse_attention",
    "elasticity",
    "comms_logger",
    "pipeline",
    "tensor_parallel",
    "weight_quantization",
    "zero_optimization.zeropp_loco_param",
)
"""Sections whose values DeepSpeed (or the torch class it builds) reads as lists by nature
(Adam's ``betas``, a scheduler's milestones, elastic micro-batch lists, profiled ops): their lists
are passed through untouched, never searched. DeepSpeed's autotuner never expands them either."""

STAGE_KNOBS = {
    0: (),
    1: ("reduce_bucket_size", "allgather_bucket_size"),
    2: ("overlap_comm", "reduce_scatter", "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients"),
    # DeepSpeed's stage-3 space also lists allgather_partitions and allgather_bucket_size, which
    # stage 3 ignores (it gathers through the prefetch bucket): searching them only costs trials.
    3: (
        "overlap_comm",
        "reduce_bucket_size",
        "contiguous_gradients",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_max_live_parameters",
    ),
}
"""Knobs searched by default (``fast: false``) per stage; a stage's own keys only."""
STAGE3_ONLY = (
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "sub_group_size",
    "stage3_gather_16bit_weights_on_model_save",
)
STAGE12_ONLY = ("allgather_bucket_size", "allgather_partitions", "reduce_scatter")


DEEPSPEED_DEFAULTS = {
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "reduce_scatter": True,
    "contiguous_gradients": True,
    "allgather_partitions": True,
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_param_persistence_threshold": 1e5,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "sub_group_size": 1e9,
}
"""What DeepSpeed uses for a knob the config leaves out (overlap_comm: on for stage 3 only)."""


def effective_value(config: dict[str, Any], key: str, stage: int) -> Any:
    """The value DeepSpeed runs with for ``key`` under ``config`` (set there, else its default)."""
    value = _lookup(config, key)
    if value is not None or not key.startswith(f"{ZERO}."):
        return value
    leaf = key[len(ZERO) + 1 :]
    if leaf == "overlap_comm":
        return stage == 3
    if leaf.endswith(".device"):
        return "none"
    return DEEPSPEED_DEFAULTS.get(leaf)


def default_values(knob: str, hidden_size: int | None) -> tuple:
    h2 = hidden_size * hidden_size if hidden_size else None
    centred = {
        "reduce_bucket_size": h2,
        "allgather_bucket_size": h2,
        "stage3_prefetch_bucket_size": 0.9 * h2 if h2 else None,
        "stage3_param_persistence_threshold": 10 * hidden_size if hidden_size else None,
    }
    if centred.get(knob) is not None:
        c = centred[knob]
        return tuple(float(int(v)) for v in (c / 10, c, 10 * c))
    return {
        "overlap_comm": (True, False),
        "reduce_scatter": (False, True),
        "contiguous_gradients": (False, True),
        "reduce_bucket_size": BUCKETS,
        "allgather_bucket_size": BUCKETS,
        "stage3_prefetch_bucket_size": BUCKETS,
        "stage3_param_persistence_threshold": (1e4, 1e6),
        "stage3_max_live_parameters": (1e8, 1e9),
        "stage3_max_reuse_distance": (1e8, 1e9),
        "sub_group_size": (1e9, 1e12),
    }[knob]


@dataclass(frozen=True)
class Dimension:
    key: str
    """A dotted ds_config key, or MICRO_BATCH."""
    values: tuple

    def __post_init__(self):
        assert self.values, f"{self.key}: a dimension needs values"


def user_dimensions(config: dict[str, Any]) -> list[Dimension]:
    """Every list-valued key of the user's ds_config (nested, dotted) where DeepSpeed reads a
    scalar, except the ones the tuner sets itself (stage, batch sizes) and the autotuning section.
    Lists inside :data:`LIST_SECTIONS`, and lists holding lists or objects, are values, not
    dimensions."""
    out: list[Dimension] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in ("autotuning", f"{ZERO}.stage") or path in BATCH_KEYS or path in LIST_SECTIONS:
                continue
            if isinstance(value, dict):
                walk(value, path + ".")
            elif isinstance(value, list) and not any(isinstance(v, (list, dict)) for v in value):
                if not value:
                    raise ConfigError(f"{path}: an empty list gives nothing to search; give one value or several")
                if len(set(map(repr, value))) != len(value):
                    raise ConfigError(f"{path}: {value!r} repeats a value; list each value once")
                out.append(Dimension(path, tuple(value)))

    walk(config, "")
    return out


def collapse(config: dict[str, Any], stage: int | None = None) -> dict[str, Any]:
    """The config with each listed value replaced by its first, or (``stage`` given) its first
    that ``stage`` can run: what trials outside a knob search (the micro-batch search) run with,
    since DeepSpeed itself takes no lists. The order of a list never decides which stages run:
    ``offload_param: ["cpu", "none"]`` gives stages 0-2 "none" and stage 3 "cpu"."""
    picks = []
    for d in user_dimensions(config):
        runnable = [v for v in d.values if stage is None or _runs_at(d.key, v, stage)]
        picks.append((d.key, (runnable or d.values)[0]))
    return apply_overrides(config, picks)


def _runs_at(key: str, value: Any, stage: int) -> bool:
    """Whether ``stage`` can run with ``key`` at ``value`` (offload needs a stage that has it)."""
    if (value or "none") == "none":
        return True
    if key == f"{ZERO}.offload_param.device":
        return stage == 3
    if key == f"{ZERO}.offload_optimizer.device":
        return stage >= 1
    return True


def _lookup(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def stage_dimensions(
    stage: int, config: dict[str, Any], *, defaults: bool, hidden_size: int | None = None
) -> list[Dimension]:
    """The knob dimensions of one stage: the user's lists that apply to it, plus (``defaults``)
    the stage's default knobs the user left unset."""
    dims = [d for d in user_dimensions(config) if _applies(d.key, stage)]
    if defaults:
        listed = {d.key for d in dims}
        for knob in STAGE_KNOBS[stage]:
            key = f"{ZERO}.{knob}"
            if key not in listed and _lookup(config, key) is None:
                dims.append(Dimension(key, default_values(knob, hidden_size)))
    return dims


def _applies(key: str, stage: int) -> bool:
    leaf = key.rsplit(".", 1)[-1]
    if key.startswith(f"{ZERO}."):
        if stage == 0:
            return False
        if leaf in STAGE3_ONLY or key.startswith(f"{ZERO}.offload_param"):
            return stage == 3
        if leaf in STAGE12_ONLY:
            return stage in (1, 2)
    return True


def check_offload_devices(config: dict[str, Any]) -> None:
    """An offload device (or a listed one) that DeepSpeed does not know is a ConfigError."""
    zero = config.get(ZERO) or {}
    for block in ("offload_optimizer", "offload_param"):
        b = zero.get(block)
        if not isinstance(b, dict):
            continue
        devices = b.get("device", "none")
        for dev in devices if isinstance(devices, list) else [devices]:
            if (dev or "none") not in OFFLOAD_DEVICES:
                raise ConfigError(f"{ZERO}.{block}.device: {dev!r} is not an offload device; use none, cpu or nvme")


def invalid_reason(stage: int, config: dict[str, Any]) -> str | None:
    """Why this stage with these settings cannot run, or None. Checked before any launch."""
    zero = config.get(ZERO) or {}

    def device(block: str) -> str:
        b = zero.get(block)
        return str(b.get("device") or "none") if isinstance(b, dict) else "none"

    for block in ("offload_optimizer", "offload_param"):
        if device(block) == "nvme" and not (zero.get(block) or {}).get("nvme_path"):
            return f"{block} to nvme needs {ZERO}.{block}.nvme_path"
    if device("offload_param") != "none" and stage < 3:
        return "offload_param needs ZeRO stage 3"
    if device("offload_optimizer") != "none" and stage < 1:
        return "offload_optimizer needs ZeRO stage 1 or higher"
    return None


def apply_overrides(config: dict[str, Any], overrides) -> dict[str, Any]:
    cfg = copy.deepcopy(config)
    for key, value in overrides:
        node = cfg
        *path, leaf = key.split(".")
        for part in path:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return cfg


def trial_config(
    base: dict[str, Any], spec: TrialSpec, dp: int, *, script_fills: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    """The user's config with the trial's stage, micro-batch, accumulation and knobs filled in.
    ``script_fills``: the batch keys the script receives as arguments (arg_mappings). Then the
    config gains no batch key the script fills itself: a mapped key and the global batch stay as
    the user had them where they are left out or ``"auto"`` (Hugging Face's Trainer refuses
    numbers that disagree with its arguments), and so does any other ``"auto"``."""
    cfg = apply_overrides(base, spec.overrides)
    zero = dict(cfg.get(ZERO) or {})
    zero["stage"] = spec.stage
    cfg[ZERO] = zero
    values = {
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "train_batch_size": spec.micro_batch * spec.grad_accum * dp,
    }
    for key, value in values.items():
        if script_fills:
            user = cfg.get(key, "auto")  # left out: as "auto", the script's or DeepSpeed's to fill
            derived = key in script_fills or key == "train_batch_size"
            if user == "auto" and (derived or key in cfg):
                continue
        cfg[key] = value
    return cfg


@dataclass(frozen=True)
class Space:
    """The configurations of one stage to search: the product of its dimensions, in a fixed
    (grid) order: the last dimension varies fastest."""

    stage: int
    dims: tuple[Dimension, ...]
    global_batch: int | None
    dp: int
    default_gas: int = 1
    fixed: tuple[tuple[str, Any], ...] = ()
    """Overrides every configuration carries (the offload of an offload phase)."""

    @property
    def size(self) -> int:
        n = 1
        for d in self.dims:
            n *= len(d.values)
        return n

    def point(self, values: dict[str, Any]) -> TrialSpec:
        """The trial of one assignment ``{key: value}`` (every dimension given)."""
        mb = values.get(MICRO_BATCH)
        assert mb is not None, "the space needs a micro-batch dimension"
        gas = self.global_batch // (mb * self.dp) if self.global_batch else self.default_gas
        knobs = tuple((d.key, values[d.key]) for d in self.dims if d.key != MICRO_BATCH)
        return TrialSpec(stage=self.stage, micro_batch=mb, grad_accum=gas, overrides=self.fixed + knobs)

    def values_of(self, spec: TrialSpec) -> dict[str, Any]:
        given = dict(spec.overrides)
        return {d.key: spec.micro_batch if d.key == MICRO_BATCH else given.get(d.key) for d in self.dims}

    def point_of(self, spec: TrialSpec, config: dict[str, Any]) -> TrialSpec | None:
        """The point that runs what ``spec`` ran under ``config`` (its knobs at the values set
        there or DeepSpeed's defaults), or None when one of them is outside the space."""
        given = dict(spec.overrides)
        values = {}
        for d in self.dims:
            v = (
                spec.micro_batch
                if d.key == MICRO_BATCH
                else given.get(d.key, effective_value(config, d.key, self.stage))
            )
            same = [x for x in d.values if x == v and isinstance(x, bool) == isinstance(v, bool)]
            if not same:
                return None
            values[d.key] = same[0]
        return self.point(values)

    def __iter__(self) -> Iterator[TrialSpec]:
        for combo in itertools.product(*(d.values for d in self.dims)):
            yield self.point({d.key: v for d, v in zip(self.dims, combo)})
