"""The user's own configuration, and what is searched around it.

A ds_config with an ``autotuning`` section is read with DeepSpeed's meanings: an int stage is
the one stage tried, a list the stages, ``"all"`` (or none) every one; an int micro-batch is
where the search starts, as DeepSpeed's autotuner starts from it and tunes upwards; a list is
the micro-batches tried (a list of one fixes it), ``"auto"`` searches. A config without the
section, or with ``"enabled": false``, is one that trains as it stands: zerotune tunes around
it, searching only what ``search`` names (by default the stage and the micro-batch at the user's
global batch, and offload where the config offloads) and keeping everything else the user set.
Lists and ``"all"``/``"auto"`` mean what they say in both.

Wherever the config names one configuration (a stage, a micro-batch, no lists of knobs), that
configuration is the user's own: the tuning measures it first and compares its choice with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..trials import TrialSpec

SEARCHABLE = ("stage", "micro-batch", "offload", "knobs")
"""What ``--search`` may name around a user's configuration."""


def parse_search(value: str | list[str] | tuple[str, ...] | frozenset[str] | None) -> frozenset[str] | None:
    """``--search``'s value ("stage,micro-batch" or a list of names) as a set; None: not given."""
    if value is None:
        return None
    names = re.split(r"[,\s]+", value) if isinstance(value, str) else [str(n) for n in value]
    names = [n.strip().lower().replace("_", "-") for n in names if n.strip()]
    if not names:
        raise ConfigError(
            f"--search {value!r} names nothing to search; name any of {', '.join(SEARCHABLE)} "
            "(e.g. --search stage,micro-batch), or leave it out for the default"
        )
    names = ["micro-batch" if n in ("microbatch", "micro-batch-size", "mbs") else n for n in names]
    if unknown := [n for n in names if n not in SEARCHABLE]:
        raise ConfigError(
            f"--search {', '.join(unknown)}: not something zerotune searches; name any of {', '.join(SEARCHABLE)} "
            "(e.g. --search stage,micro-batch)"
        )
    return frozenset(names)


def tunes_around(section: dict[str, Any] | None, search: frozenset[str] | None) -> bool:
    """Whether the config trains as it stands and is tuned around: no autotuning section, or one
    with ``"enabled": false``, or ``--search`` given."""
    return search is not None or section is None or section.get("enabled") is False


def offloads(config: dict[str, Any]) -> bool:
    """The config offloads the optimizer or the parameters."""
    zero = config.get("zero_optimization") or {}
    return any(
        isinstance(zero.get(b), dict) and str(zero[b].get("device") or "none") != "none"
        for b in ("offload_optimizer", "offload_param")
    )


def default_search(config: dict[str, Any]) -> frozenset[str]:
    """What is searched around a config when ``--search`` is not given."""
    return frozenset({"stage", "micro-batch"} | ({"offload"} if offloads(config) else set()))


@dataclass(frozen=True)
class OwnValues:
    """The user's stage and micro-batch where the config names them (None where it leaves them
    to a search)."""

    stage: int | None
    micro_batch: int | None


def own_values(
    config: dict[str, Any], stage_value: Any, micro_batches: list[int] | None, dp: int, script_batch: dict[str, int]
) -> OwnValues:
    """The stage and micro-batch the user's config trains with as it stands: an int (or a list
    of one), no stage meaning DeepSpeed's default (0); the micro-batch from the script's mapped
    option where the config says "auto", or from train_batch_size where it gives none."""
    if stage_value is None:
        stage = 0
    elif isinstance(stage_value, list) and len(stage_value) == 1:
        stage = stage_value[0]
    else:
        stage = stage_value if isinstance(stage_value, int) and not isinstance(stage_value, bool) else None
    mb = micro_batches[0] if micro_batches is not None and len(micro_batches) == 1 else None
    raw = config.get("train_micro_batch_size_per_gpu")
    if mb is None and raw in (None, "auto"):
        mb = script_batch.get("train_micro_batch_size_per_gpu")
        tbs, gas = config.get("train_batch_size"), config.get("gradient_accumulation_steps")
        if mb is None and raw is None and isinstance(tbs, int):
            gas = gas if isinstance(gas, int) else 1
            mb = tbs // (gas * dp) if tbs % (gas * dp) == 0 and tbs >= gas * dp else None
    return OwnValues(stage, mb)


def own_spec(
    own: OwnValues, global_batch: int | None, gas_given: Any, dp: int, has_knob_lists: bool
) -> TrialSpec | None:
    """The trial that runs the user's own configuration, or None where the config names none."""
    if own.stage is None or own.micro_batch is None or has_knob_lists:
        return None
    if global_batch is not None:
        if global_batch % (own.micro_batch * dp):
            return None
        gas = global_batch // (own.micro_batch * dp)
    else:
        gas = gas_given if isinstance(gas_given, int) and not isinstance(gas_given, bool) else 1
    return TrialSpec(stage=own.stage, micro_batch=own.micro_batch, grad_accum=gas) if gas >= 1 else None
