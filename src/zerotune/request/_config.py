"""The ``autotuning`` section of a ds_config, read with DeepSpeed's key names and meanings.

Everything the user can get wrong is checked here, before any process starts, and reported as
one :class:`ConfigError` that names the key and the fix.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .._errors import ConfigError
from ..trials import TrialSpec
from ._own import default_search, own_spec, own_values, tunes_around

STAGES = (0, 1, 2, 3)
OBJECT_SECTIONS = (
    "zero_optimization",
    "fp16",
    "bf16",
    "optimizer",
    "scheduler",
    "activation_checkpointing",
    "flops_profiler",
)
"""Top-level ds_config keys whose value DeepSpeed reads as an object."""
MAX_MICRO_BATCH = 2**16
MAX_GLOBAL_BATCH = 2**30
MAX_PROCESSES = 2**16
"""Bounds on sizes read from configs and options: far above any real job, low enough that
nothing built from them (candidate lists, slot lists) can exhaust memory."""


class ModelInfo(BaseModel):
    """What the user already knows about the model (DeepSpeed's ``model_info``)."""

    model_config = ConfigDict(extra="forbid")
    profile: bool = False
    num_params: int | None = Field(default=None, gt=0, le=10**15)
    hidden_size: int | None = Field(default=None, gt=0, le=10**7)
    num_layers: int | None = Field(default=None, gt=0, le=10**6)


class AutotuningConfig(BaseModel):
    """DeepSpeed's ``autotuning`` keys. Defaults are DeepSpeed's, except where noted."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(
        default=False, description="DeepSpeed's switch for `deepspeed --autotuning`; zerotune tunes either way."
    )
    fast: bool = Field(
        default=True,
        description="True: the ZeRO stage, offload and micro-batch only; false: also the ZeRO knobs (bucket "
        "sizes, prefetch), searched around each stage's best micro-batch.",
    )
    results_dir: str = Field(
        default="autotuning_results", description="Where the trials and outputs go (`--results-dir` overrides it)."
    )
    exps_dir: str = Field(
        default="autotuning_exps",
        description="Where set, each trial's experiment (its config and command) is also written here, as "
        "DeepSpeed lays it out.",
    )
    overwrite: bool = Field(
        default=False,
        description="Remove the trials of an earlier tuning of the folder first. DeepSpeed's default is true; "
        "zerotune keeps finished trials so that a rerun resumes.",
    )
    metric: Literal["throughput", "latency", "flops"] = Field(
        default="throughput",
        description="What the choice optimises: samples/s, seconds per step (lowest wins) or FLOP/s per process.",
    )
    metric_path: str | None = Field(
        default=None, description="Accepted as DeepSpeed reads it; zerotune measures the metric itself."
    )
    start_profile_step: int = Field(
        default=3,
        ge=1,
        le=10_000,
        description="Where set, timing starts at this step; otherwise warm-up ends when step times settle.",
    )
    end_profile_step: int = Field(
        default=5,
        ge=2,
        le=10_000,
        description="With `start_profile_step`: a trial times at least end - start steps (at least 3).",
    )
    tuner_type: Literal["gridsearch", "random", "model_based"] = Field(
        default="gridsearch",
        description="How the ZeRO knobs are searched (`fast: false`): every point, a random order, or Optuna's TPE.",
    )
    tuner_early_stopping: int = Field(
        default=5,
        ge=1,
        le=100_000,
        description="A knob search stops after this many trials in a row without a better one.",
    )
    tuner_num_trials: int = Field(default=50, ge=1, le=100_000, description="Trials launched at most in one tuning.")
    arg_mappings: dict[str, str] | None = Field(
        default=None,
        description='The script\'s options that carry ds_config keys, e.g. `{"train_micro_batch_size_per_gpu": '
        '"--per_device_train_batch_size"}`: each trial passes its values through them.',
    )
    max_train_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GLOBAL_BATCH,
        description="The global batch (samples per optimizer step) every trial keeps; default: the "
        "ds_config's `train_batch_size`, else none is fixed.",
    )
    min_train_micro_batch_size_per_gpu: int = Field(
        default=1, ge=1, le=MAX_MICRO_BATCH, description="The smallest micro-batch tried."
    )
    max_train_micro_batch_size_per_gpu: int = Field(
        default=1024, ge=1, le=MAX_MICRO_BATCH, description="The largest micro-batch tried."
    )
    num_tuning_micro_batch_sizes: int = Field(
        default=3, ge=1, le=64, description="Micro-batches measured per stage, around the largest that fits."
    )
    mp_size: int = Field(
        default=1,
        ge=1,
        le=MAX_PROCESSES,
        description="The model-parallel degree: data-parallel ranks are the processes / `mp_size`.",
    )
    model_info: ModelInfo | None = Field(
        default=None,
        description="What is known of the model (`num_params`, `hidden_size`, `num_layers`): the memory model "
        "starts from it instead of the first trial.",
    )
    model_info_path: str | None = Field(default=None, description="Accepted as DeepSpeed reads it.")
    warm_trials: bool = Field(
        default=True,
        description="zerotune's own: trials on one node run in warm processes, one launch serving many; "
        "false starts each in processes of its own (`--cold-trials`).",
    )

    @model_validator(mode="after")
    def _check(self) -> AutotuningConfig:
        if self.min_train_micro_batch_size_per_gpu > self.max_train_micro_batch_size_per_gpu:
            raise ValueError(
                f"min_train_micro_batch_size_per_gpu ({self.min_train_micro_batch_size_per_gpu}) is above "
                f"max_train_micro_batch_size_per_gpu ({self.max_train_micro_batch_size_per_gpu}); "
                "lower the minimum or raise the maximum"
            )
        if self.end_profile_step <= self.start_profile_step:
            raise ValueError(
                f"end_profile_step ({self.end_profile_step}) must be above start_profile_step "
                f"({self.start_profile_step})"
            )
        return self


def _pydantic_message(err: ValidationError, section: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        where = f"{section}.{loc}" if loc else section
        if e["type"] == "extra_forbidden":
            fields = AutotuningConfig.model_fields if len(e["loc"]) == 1 else ModelInfo.model_fields
            close = difflib.get_close_matches(str(e["loc"][-1]), list(fields), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(fields)}"
            lines.append(f"{where}: unknown key{hint}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(
                f"{where}: {msg} (got {e.get('input')!r})" if e["type"] != "value_error" else f"{where}: {msg}"
            )
    return "; ".join(lines)


@dataclass(kw_only=True)
class TuningRequest:
    """What to tune, read from a ds_config: the user's config without the autotuning section,
    the stages and micro-batches to consider, and the autotuning options."""

    space_config: dict[str, Any]
    """The user's ds_config minus ``autotuning``, its lists in place: the knob dimensions to
    search (batch values coerced to ints; stage and micro-batch lists, "all" and "auto" kept)."""
    autotuning: AutotuningConfig
    stages: list[int]
    """Stages to try, ascending."""
    micro_batches: list[int] | None
    """Micro-batches the user fixed (an int or a list); None means search the bounds."""
    global_batch: int | None
    """Fixed train batch size (max_train_batch_size, else the user's train_batch_size), or None."""
    own: TrialSpec | None = None
    """The user's own configuration, where the config names one (see request._own): measured
    first, and what the choice is compared with."""
    around: frozenset[str] | None = None
    """Where the config is tuned around (see request._own): what is searched; None where the
    autotuning section's meanings apply."""
    offload: bool | None = None
    """Whether offload is searched, as the config asks: True (searched too), False (never), None
    (only where nothing fits without it)."""

    def base(self, stage: int) -> dict[str, Any]:
        """What the micro-batch search runs at ``stage``: each listed knob at its first value that
        the stage can run (so a list's order never decides which stages are measured)."""
        from ._space import collapse

        return collapse(self.space_config, stage)


MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 64
"""Bounds checked before a config file is parsed: a ds_config or a model's config.json is a few
KB and a few levels deep; a larger or deeper file is the wrong file, and parsing it would take
the memory or the stack of the tuner."""


def read_config_text(path: str | Path, what: str) -> str:
    """The text of the config file ``path`` (``what`` names it in errors), checked to be a
    regular file within :data:`MAX_CONFIG_BYTES` and :data:`MAX_CONFIG_DEPTH` before any parser
    sees it."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder; give the path of the file")
    if not p.exists():
        raise ConfigError(f"{what} {str(path)!r} does not exist; give the path of a JSON file")
    if not p.is_file():
        raise ConfigError(
            f"{what} {str(path)!r} is not a regular file (a pipe or a device); give the path of a JSON file"
        )
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {e.strerror}; check its permissions") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{what} {str(path)!r} is over {MAX_CONFIG_BYTES >> 20} MiB, far more than any config; give the right file"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {str(path)!r} is not a UTF-8 text file") from None
    if (depth := nesting(text)) > MAX_CONFIG_DEPTH:
        raise ConfigError(
            f"{what} {str(path)!r} nests {depth} levels deep, beyond any config (at most "
            f"{MAX_CONFIG_DEPTH}); give the right file"
        )
    return text


def nesting(text: str) -> int:
    """The deepest nesting of objects and lists in JSON (or HJSON) text, strings skipped."""
    depth = deepest = 0
    in_string, escaped = "", False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == in_string:
                in_string = ""
        elif ch in "\"'":
            in_string = ch
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's keys, refused where one repeats (DeepSpeed refuses such a config too)."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        repeated = [k for k, _ in pairs if k in seen or seen.add(k)]
        raise ConfigError(
            f"duplicate keys {sorted(set(repeated))}: DeepSpeed refuses a config that names a key "
            "twice in one object; keep one of each"
        )
    return data


def load_ds_config(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """Read a ds_config from a dict or a file, as DeepSpeed reads one (HJSON: comments and
    unquoted keys are allowed; a key twice in one object is not), with a clear error for a bad file."""
    if isinstance(source, dict):
        try:
            return json.loads(json.dumps(source))  # a deep copy that is also proof it is JSON
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"the ds_config is not JSON data ({e}); use plain numbers, strings, lists and dicts"
            ) from None
        except RecursionError:
            raise ConfigError(
                f"the ds_config nests deeper than any config (at most {MAX_CONFIG_DEPTH} levels); give the right dict"
            ) from None
    if not isinstance(source, (str, Path)):
        raise ConfigError(
            f"the ds_config must be a JSON object {{...}} or the path of a JSON file, not {type(source).__name__}"
        )
    path = Path(source)
    text = read_config_text(path, "ds_config")
    import hjson

    try:
        data = hjson.loads(text, object_pairs_hook=_no_duplicates)
    except ConfigError as e:
        raise ConfigError(f"ds_config {str(path)!r}: {e}") from None
    except hjson.HjsonDecodeError as e:
        raise ConfigError(
            f"ds_config {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}; "
            "fix the file (a trailing comma or a missing quote is the usual cause)"
        ) from None
    except (ValueError, OverflowError, RecursionError) as e:
        raise ConfigError(
            f"ds_config {str(path)!r} cannot be read as JSON ({type(e).__name__}: {str(e)[:80]}); "
            "use plain numbers such as 64 or 5e8"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"ds_config {str(path)!r} must hold a JSON object {{...}}, not {type(data).__name__}")
    return data


def parse_stages(value: Any) -> list[int]:
    if value is None or value == "all":
        return list(STAGES)
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v in STAGES for v in values):
        raise ConfigError(
            f"zero_optimization.stage: {value!r} is not a ZeRO stage; use 0, 1, 2 or 3, "
            'a list of them such as [1, 2], or "all"'
        )
    return sorted(set(values))


def batch_count(value: Any, key: str, limit: int = MAX_GLOBAL_BATCH) -> int | str | None:
    """A batch value of the ds_config as DeepSpeed means it: a positive int (``64.0`` and ``"64"``
    are unambiguous and read as 64), ``"auto"`` (filled by the script, as Hugging Face does) or
    absent. Anything else (``"abc"``, NaN, 2.5, true, 1e400) is a ConfigError naming the key."""
    if value is None or value == "auto":
        return value
    number: Any = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise ConfigError(
            f"{key}: {json.dumps(value)[:40]} is not a number of samples; use a positive whole "
            'number such as 64, or "auto" for the script to fill'
        )
    if number > limit:
        raise ConfigError(
            f"{key}: {number} is beyond any real job (at most {limit}); give the number of samples you train with"
        )
    return number


def _parse_micro_batches(value: Any) -> list[int] | None:
    if value is None or value == "auto":
        return None
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(
            "train_micro_batch_size_per_gpu: an empty list gives nothing to search; use a positive "
            'integer, a list of them, or "auto" to let zerotune search'
        )
    if any(v is None for v in values):
        raise ConfigError(
            "train_micro_batch_size_per_gpu: a list holds null; list positive integers (or give "
            '"auto" to let zerotune search)'
        )
    return (
        sorted({batch_count(v, "train_micro_batch_size_per_gpu", MAX_MICRO_BATCH) for v in values if v != "auto"} or ())
        or None
    )


def _check_batch_triple(config: dict[str, Any], dp: int) -> None:
    """DeepSpeed's rule, where the config fixes all three batch values: train_batch_size =
    micro-batch x gradient_accumulation_steps x data-parallel processes (DeepSpeed refuses the
    config otherwise, so zerotune never bends one of them to fit)."""
    tbs, gas, mb = (
        config.get(k) for k in ("train_batch_size", "gradient_accumulation_steps", "train_micro_batch_size_per_gpu")
    )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (tbs, gas, mb)):
        return
    if tbs != mb * gas * dp:
        raise ConfigError(
            f"train_batch_size {tbs} is not train_micro_batch_size_per_gpu {mb} x "
            f"gradient_accumulation_steps {gas} x {dp} data-parallel processes ({mb * gas * dp}), "
            "which DeepSpeed requires; drop gradient_accumulation_steps (zerotune derives it) or "
            "make the three agree"
        )


def parse_request(
    ds_config: dict[str, Any],
    *,
    world_size: int,
    script_batch: dict[str, int] | None = None,
    search: frozenset[str] | None = None,
) -> TuningRequest:
    """Validate ``ds_config`` for tuning on ``world_size`` processes. ``script_batch``: the batch
    values the command gives the script's mapped options (arg_mappings), which set the global
    batch where neither the config nor the autotuning section does. ``search``: what to search
    around the user's config (``--search``; see request._own), None for the default."""
    config = load_ds_config(ds_config)
    given_section = config.pop("autotuning", None)
    section = given_section or {}
    if not isinstance(section, dict):
        raise ConfigError("autotuning: must be a JSON object {...}")
    try:
        at = AutotuningConfig.model_validate(section)
    except ValidationError as e:
        raise ConfigError(_pydantic_message(e, "autotuning")) from None
    for key in OBJECT_SECTIONS:
        if key in config and not isinstance(config[key], dict):
            raise ConfigError(f"{key}: must be a JSON object {{...}}, not {json.dumps(config[key])[:40]}")
    zero = config.get("zero_optimization", {})
    for block in ("offload_optimizer", "offload_param"):
        if block in zero and zero[block] is not None and not isinstance(zero[block], dict):
            raise ConfigError(f'zero_optimization.{block}: must be a JSON object such as {{"device": "cpu"}}')
    stages = parse_stages(zero.get("stage"))
    micro_batches = _parse_micro_batches(config.get("train_micro_batch_size_per_gpu"))
    for key in ("train_batch_size", "gradient_accumulation_steps"):
        if key in config:
            config[key] = batch_count(config[key], key)
    if isinstance(config.get("train_micro_batch_size_per_gpu"), (str, float)) and micro_batches:
        config["train_micro_batch_size_per_gpu"] = micro_batches[0]
    if world_size % at.mp_size:
        raise ConfigError(
            f"autotuning.mp_size ({at.mp_size}) does not divide the {world_size} processes; "
            "use a model-parallel size that divides --num-gpus x --num-nodes"
        )
    dp = world_size // at.mp_size
    _check_batch_triple(config, dp)
    script_batch = script_batch or {}
    own = own_values(config, zero.get("stage"), micro_batches, dp, script_batch)
    global_batch = at.max_train_batch_size
    user_tbs = config.get("train_batch_size")
    if global_batch is None and isinstance(user_tbs, int) and not isinstance(user_tbs, bool):
        global_batch = user_tbs
    if global_batch is None and (script_batch or {}).get("train_micro_batch_size_per_gpu"):
        gas = config.get("gradient_accumulation_steps")
        gas = script_batch.get("gradient_accumulation_steps") or (gas if isinstance(gas, int) else 1)
        global_batch = script_batch["train_micro_batch_size_per_gpu"] * gas * dp
        if global_batch > MAX_GLOBAL_BATCH:
            raise ConfigError(
                f"the command's batch options give a global batch of {global_batch}, beyond any real "
                f"job (at most {MAX_GLOBAL_BATCH}); give the batch sizes you train with"
            )
    if global_batch is not None:
        if global_batch % dp:
            raise ConfigError(
                f"the global batch {global_batch} cannot be split over {dp} data-parallel processes; "
                f"set autotuning.max_train_batch_size to a multiple of {dp}"
            )
        per_rank = global_batch // dp
        if per_rank < at.min_train_micro_batch_size_per_gpu:
            raise ConfigError(
                f"the global batch {global_batch} gives {per_rank} samples per data-parallel process, below "
                f"min_train_micro_batch_size_per_gpu ({at.min_train_micro_batch_size_per_gpu}); raise "
                "max_train_batch_size or lower the minimum"
            )
    around = search if search is not None else default_search(config) | ({"knobs"} if at.fast is False else set())
    if not tunes_around(given_section if isinstance(given_section, dict) else None, search):
        around = None
    if global_batch is None and around is not None and own.micro_batch is not None:
        gas = config.get("gradient_accumulation_steps")
        global_batch = own.micro_batch * (gas if isinstance(gas, int) else 1) * dp  # the user's, kept
    if micro_batches is not None and global_batch is not None:
        bad = [m for m in micro_batches if (global_batch // dp) % m]
        if bad:
            raise ConfigError(
                f"train_micro_batch_size_per_gpu {bad} does not divide the {global_batch // dp} samples "
                f"per process of the global batch {global_batch}; choose divisors of it"
            )
    for key, arg in (at.arg_mappings or {}).items():
        if not arg.startswith("-"):
            raise ConfigError(f"autotuning.arg_mappings.{key}: {arg!r} must be a script option such as --{arg}")
    from ._space import check_offload_devices, user_dimensions

    knob_lists = bool(user_dimensions(config))  # empty or repeated lists are errors now, not at the knob search
    check_offload_devices(config)
    own_trial = own_spec(own, global_batch, config.get("gradient_accumulation_steps"), dp, knob_lists)
    fixed_int = isinstance(config.get("train_micro_batch_size_per_gpu"), int)
    offload = None
    if around is not None:
        if "stage" in around and not isinstance(zero.get("stage"), list):
            stages = list(STAGES)
        elif "stage" not in around and zero.get("stage") is None and own.stage is not None:
            stages = [own.stage]  # DeepSpeed's default, which the config trains with
        if "micro-batch" in around and fixed_int:
            micro_batches = None
        elif "micro-batch" not in around and micro_batches is None and own_trial is not None:
            micro_batches = [own_trial.micro_batch]  # the config's, given through train_batch_size
        at = at.model_copy(update={"fast": "knobs" not in around})
        offload = True if "offload" in around else (False if search is not None else None)
    elif fixed_int and micro_batches is not None:
        # DeepSpeed's meaning: the user's micro-batch is where the search starts, upwards.
        at = at.model_copy(update={"min_train_micro_batch_size_per_gpu": micro_batches[0]})
        at.max_train_micro_batch_size_per_gpu = max(at.max_train_micro_batch_size_per_gpu, micro_batches[0])
        micro_batches = None
    return TuningRequest(
        space_config=config,
        autotuning=at,
        stages=stages,
        micro_batches=micro_batches,
        global_batch=global_batch,
        own=own_trial,
        around=around,
        offload=offload,
    )
