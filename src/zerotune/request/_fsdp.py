"""FSDP2 as a second engine: the config of an FSDP2 trial, and the numbers each engine trains.

An FSDP2 trial's config (``fsdp_config.json`` in its folder) says whether parameters are
resharded after forward, CPU offload (all or nothing in FSDP2: parameters, gradients and
optimizer states together), the wrapping unit, whether gradients are reduced at every
micro-step of an accumulation, the mixed precision the user chose and the batch. A target turns
it into what its framework reads (the Hugging Face Trainer reads it as it is; an Accelerate
config's ``fsdp_config`` block).

Two configurations are ranked against each other only when they train the same numbers: the
dtype of the weights the optimizer updates (master), of the passes (compute) and of the gradient
reduction. :func:`numerics` says what each engine keeps for the user's precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..trials import ENGINES, TrialSpec
from ..units import is_count, parse_count

FSDP_FILE = "fsdp_config.json"
DS_FILE = "ds_config.json"


def config_file(spec: TrialSpec) -> str:
    """The name of a trial's config file in its folder."""
    return FSDP_FILE if spec.engine == "fsdp" else DS_FILE


@dataclass(frozen=True, kw_only=True)
class FsdpSettings:
    """What an FSDP2 trial keeps from the user's setup, whatever the search picks."""

    wrap: tuple[str, ...] = ()
    """Class names of the modules each wrapped as one FSDP2 unit (transformer blocks); empty: the
    model's own ``_no_split_modules`` (Hugging Face models), else the model as one unit."""
    min_params: int | None = None
    """Units by parameter count instead: each module of at least this many parameters not yet
    wrapped is one (torch's size-based policy)."""
    mixed_precision: str = "no"
    """The user's mixed precision (``no``, ``bf16`` or ``fp16``), never searched: a trial in another
    precision trains other numbers."""


WRAP = "TRANSFORMER_BASED_WRAP"
"""Each named block (or, with none named, each of the model's ``_no_split_modules``) one unit."""
SIZE_WRAP = "SIZE_BASED_WRAP"
"""Each module of at least ``min_num_params`` parameters one unit."""


def fsdp_config(spec: TrialSpec, settings: FsdpSettings) -> dict[str, Any]:
    """The config an FSDP2 trial of ``spec`` runs with. Its keys are the Hugging Face Trainer's
    ``fsdp_config`` keys (which ignores the others) plus zerotune's: ``engine``,
    ``sync_each_batch``, ``mixed_precision`` and the batch."""
    assert spec.engine == "fsdp", spec
    knobs = dict(spec.overrides)
    return {
        "engine": "fsdp",
        "version": 2,
        "reshard_after_forward": spec.stage == 3,
        "cpu_offload": bool(knobs.get("fsdp.offload", False)),
        **(
            {"auto_wrap_policy": SIZE_WRAP, "min_num_params": settings.min_params}
            if settings.min_params
            else {
                "auto_wrap_policy": WRAP,
                **({"transformer_layer_cls_to_wrap": list(settings.wrap)} if settings.wrap else {}),
            }
        ),
        "sync_each_batch": bool(knobs.get("fsdp.sync_each_batch", False)),
        "mixed_precision": settings.mixed_precision,
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
    }


def precision_of(ds_config: dict[str, Any]) -> str:
    """The mixed precision a ds_config trains in: ``bf16``, ``fp16`` or ``no``."""
    for key in ("bf16", "fp16"):
        block = ds_config.get(key)
        if isinstance(block, dict) and block.get("enabled") is True:
            return key
    return "no"


_DTYPE = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}


def numerics(engine: str, config: dict[str, Any]) -> dict[str, str]:
    """The dtypes a trial's config trains in: ``master`` (the weights the optimizer updates),
    ``compute`` (forward and backward) and ``reduce`` (gradients across ranks).

    DeepSpeed keeps fp32 master weights under any precision, computes in the precision's dtype
    and reduces in ``communication_data_type`` where the config sets it, else in the compute
    dtype. FSDP2 under Accelerate (which the Hugging Face Trainer uses) keeps the sharded
    parameters in fp32 (Accelerate upcasts them under mixed precision) and computes and reduces in
    the precision's dtype (its MixedPrecisionPolicy sets both)."""
    if engine == "fsdp":
        compute = _DTYPE.get(str(config.get("mixed_precision", "no")), "fp32")
        return {"master": "fp32", "compute": compute, "reduce": compute}
    compute = _DTYPE[precision_of(config)]
    reduce = config.get("communication_data_type")
    reduce = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "bfp16": "bf16"}.get(str(reduce).lower(), compute)
    return {"master": "fp32", "compute": compute, "reduce": reduce}


def numerics_line(values: dict[str, str]) -> str:
    """``master fp32, compute bf16, reduce bf16``."""
    return ", ".join(f"{k} {v}" for k, v in values.items())


def parse_engines(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """``--engines deepspeed,fsdp`` (or a list) as a tuple in that order; None: not given."""
    if value is None:
        return None
    words = value.replace(",", " ").split() if isinstance(value, str) else [str(v).strip() for v in value]
    if not words:
        raise ConfigError("--engines is empty; give deepspeed, fsdp or both: --engines deepspeed,fsdp")
    unknown = [w for w in words if w not in ENGINES]
    if unknown:
        raise ConfigError(f"--engines: {', '.join(map(repr, unknown))} is not an engine; use deepspeed, fsdp or both")
    return tuple(dict.fromkeys(words))


def parse_wrap(value: str | list[str] | tuple[str, ...] | None) -> tuple[tuple[str, ...], int | None]:
    """``--fsdp-wrap Block,Layer`` (or a list) as class names, or ``--fsdp-wrap 10M`` as a unit's
    parameter count: (names, None) or ((), count)."""
    if value is None:
        return (), None
    words = value.replace(",", " ").split() if isinstance(value, str) else [str(v).strip() for v in value]
    if len(words) == 1 and is_count(words[0]):
        return (), parse_count(words[0], what="--fsdp-wrap")
    bad = [w for w in words if not w.isidentifier()]
    if bad or not words:
        what = repr(bad[0]) if bad else "nothing"
        raise ConfigError(
            f"--fsdp-wrap: {what} is neither a class name nor a parameter count; give the model's block classes "
            "(Block) or the parameters of a unit (10M)"
        )
    return tuple(words), None


def ds_equivalent(config: dict[str, Any]) -> dict[str, Any]:
    """An FSDP2 config in the ds_config form the memory model reads (MemorySetup.from_config):
    ``engine`` "fsdp", its stage (3: resharding, 2: keeping the parameters), CPU offload of every
    sharded state, and the precision."""
    zero: dict[str, Any] = {"stage": 3 if config.get("reshard_after_forward", True) else 2}
    if config.get("cpu_offload"):
        zero.update(offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
    precision = str(config.get("mixed_precision", "no"))
    return {
        "engine": "fsdp",
        "zero_optimization": zero,
        **({precision: {"enabled": True}} if precision in ("bf16", "fp16") else {}),
    }


def deepspeed_space(precision: str) -> dict[str, Any]:
    """The ds_config the DeepSpeed side searches for a program configured for FSDP2, which brings
    none: every ZeRO stage above 0 and the micro-batch, with the values the framework fills
    itself left "auto" (its optimizer, clipping and scheduler are the same under either engine)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": [1, 2, 3]},
        "autotuning": {},
    }
    if precision in ("bf16", "fp16"):
        config[precision] = {"enabled": "auto"}
    return config
