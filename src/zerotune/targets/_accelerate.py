"""An Accelerate script as a tuning target, started the way its users start it:
``accelerate launch --config_file acc.yaml train.py [args]`` with a DeepSpeed plugin in the config.

zerotune takes the command as the user types it (``zerotune tune accelerate launch ...``). The
ds_config to tune is the one the Accelerate config names (``deepspeed_config_file``), or the one
its DeepSpeed keys (``zero_stage``, ``offload_optimizer_device``, ...) describe. Every trial is
started by ``accelerate launch`` with one config of zerotune's (the user's, normalized: DeepSpeed
from a file, the processes zerotune runs); the probe in each rank points Accelerate at the trial's
ds_config (``ACCELERATE_DEEPSPEED_CONFIG_FILE``), so warm processes serve trial after trial. The
result is written in the user's form: ``accelerate_config_optimal.yaml`` naming
``ds_config_optimal.json``, and the ``accelerate launch`` command that uses it.

Accelerate fills the micro-batch from the script's DataLoader and the accumulation from
``Accelerator(gradient_accumulation_steps=...)``, so both reach the script as its options: the
``arg_mappings`` of the autotuning section, or ``--per_device_train_batch_size`` and
``--gradient_accumulation_steps`` where the script declares them (transformers' ``*_no_trainer``
examples do). Accelerate itself is imported only in the rank processes; PyYAML (which it
requires) reads and writes the configs here.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ._accelerate_files import AccelerateLauncher, work_folder, write_yaml
from ._accelerate_files import yaml_module as _yaml
from ._base import Target
from ._command import UserCommand, option_value

LAUNCH_OPTIONS_REPLACED = (
    "--config_file",
    "--num_processes",
    "--num_machines",
    "--main_process_port",
    "--gpu_ids",
    "--deepspeed_config_file",
)
"""accelerate launch options zerotune sets for each run (the user's values are read, not passed on)."""
INLINE_OPTIONS = (
    "--zero_stage",
    "--offload_optimizer_device",
    "--offload_param_device",
    "--gradient_clipping",
    "--gradient_accumulation_steps",
    "--zero3_save_16bit_model",
    "--mixed_precision",
)
"""accelerate launch options that describe DeepSpeed in place of a ds_config: kept in the config file."""
SCRIPT_OPTIONS = {
    "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
    "gradient_accumulation_steps": "--gradient_accumulation_steps",
}
INLINE_KEYS = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "zero3_save_16bit_model",
)
OPTIMAL_YAML = "accelerate_config_optimal.yaml"
"""The tuned config in Accelerate's form, beside ds_config_optimal.json (AccelerateTarget.output_files)."""


def is_accelerate_launch(command: list[str] | tuple[str, ...]) -> bool:
    return len(command) >= 2 and Path(command[0]).name == "accelerate" and command[1] == "launch"


MAX_PROCESSES = 65536


def _number(value: Any, key: str, path: Path, kind=int, limit: float = MAX_PROCESSES) -> Any:
    """A number of the Accelerate config (a whole one from 1, or a finite one from 0, at most
    ``limit``), or a ConfigError naming the key."""
    try:
        number = None if isinstance(value, bool) else kind(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number) or not (1 if kind is int else 0) <= number <= limit:
        what = "whole number from 1" if kind is int else "number from 0"
        raise ConfigError(f"{path}: {key}: {value!r} is not a {what} to {limit:g}; fix the Accelerate config")
    return number


def default_config_file() -> Path:
    """Where ``accelerate config`` saves and ``accelerate launch`` looks without --config_file."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface"
    )
    return Path(home) / "accelerate" / "default_config.yaml"


@dataclass(frozen=True)
class AccelerateLaunch:
    """``accelerate launch [options] script.py [script args]``, split."""

    options: tuple[str, ...]
    """accelerate launch's own options as the user gave them."""
    script_command: tuple[str, ...]
    """script.py and its arguments."""

    @classmethod
    def split(cls, command: list[str] | tuple[str, ...]) -> AccelerateLaunch:
        rest = list(command[2:])
        for i, word in enumerate(rest):
            if word in ("-m", "--module", "--no_python"):
                raise ConfigError(
                    f"accelerate launch {word} is not supported by zerotune; launch the script as a "
                    ".py file: zerotune tune accelerate launch --config_file acc.yaml train.py ..."
                )
            if word.endswith(".py") and not (i and rest[i - 1] in ("--config_file", "--deepspeed_config_file")):
                return cls(tuple(rest[:i]), tuple(rest[i:]))
        raise ConfigError(
            "no training script in the accelerate launch command; usage: zerotune tune accelerate "
            "launch --config_file acc.yaml train.py [script args]"
        )

    def option(self, name: str) -> str | None:
        return option_value(self.options, name)

    def kept_options(self) -> list[str]:
        """The user's options that every run keeps (the ones zerotune sets are left out)."""
        out, skip = [], False
        for word in self.options:
            if skip:
                skip = False
                continue
            name = word.split("=", 1)[0]
            if name in LAUNCH_OPTIONS_REPLACED:
                skip = "=" not in word
                continue
            out.append(word)
        return out


def read_accelerate_config(launch: AccelerateLaunch) -> tuple[Path, dict[str, Any]]:
    path = Path(launch.option("--config_file") or default_config_file())
    if not path.is_file():
        raise ConfigError(
            f"Accelerate config {str(path)!r} does not exist; give it with accelerate launch "
            "--config_file acc.yaml (or write one with `accelerate config`)"
        )
    try:
        data = _yaml().safe_load(path.read_text())
    except Exception as e:  # yaml.YAMLError and its many subclasses
        raise ConfigError(
            f"Accelerate config {str(path)!r} is not valid YAML ({str(e).splitlines()[0]}); fix the file"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"Accelerate config {str(path)!r} must be a mapping of keys (as `accelerate config` writes it)"
        )
    for word in launch.options:
        if word.split("=", 1)[0] in INLINE_OPTIONS:
            raise ConfigError(
                f"accelerate launch {word.split('=', 1)[0]}: zerotune tunes DeepSpeed through "
                f"the config file; put it in {path} instead of the command"
            )
    kind = str(data.get("distributed_type", "")).upper()
    uses_deepspeed = kind == "DEEPSPEED" or "--use_deepspeed" in launch.options
    if kind == "FSDP" and not uses_deepspeed:
        if not isinstance(data.get("fsdp_config") or {}, dict):
            raise ConfigError(
                f"{path}: fsdp_config must be a mapping of fsdp_* keys (as `accelerate config` writes it)"
            )
        version = (data.get("fsdp_config") or {}).get("fsdp_version", 1)
        if str(version) != "2":
            raise ConfigError(
                f"Accelerate config {str(path)!r} uses FSDP version {version}; zerotune tunes FSDP2: set "
                "fsdp_config: {fsdp_version: 2}"
            )
    elif not uses_deepspeed:
        raise ConfigError(
            f"Accelerate config {str(path)!r} uses neither DeepSpeed nor FSDP (distributed_type: "
            f"{data.get('distributed_type')!r}); set distributed_type: DEEPSPEED with a deepspeed_config, or "
            "FSDP with fsdp_config: {fsdp_version: 2}"
        )
    return path, data


def ds_config_of(path: Path, data: dict[str, Any], launch: AccelerateLaunch) -> Path | dict[str, Any]:
    """The ds_config the Accelerate config uses: the file it names, or its DeepSpeed keys as one."""
    plugin = data.get("deepspeed_config") or {}
    if not isinstance(plugin, dict):
        raise ConfigError(f"{path}: deepspeed_config must be a mapping")
    named = launch.option("--deepspeed_config_file") or plugin.get("deepspeed_config_file")
    if named:
        named = Path(str(named))  # as accelerate launch reads it: relative to the folder it runs in
        if not named.is_file():
            raise ConfigError(
                f"{path} names the ds_config {str(named)!r} (deepspeed_config_file), which does not "
                f"exist here, in {os.getcwd()}; run from the folder accelerate launch runs in, or give "
                "an absolute path"
            )
        return named
    stage = plugin.get("zero_stage", 2)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError(f"{path}: deepspeed_config.zero_stage: {stage!r} is not a ZeRO stage; use 0, 1, 2 or 3")
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": stage},
    }
    zero = config["zero_optimization"]
    for block in ("optimizer", "param"):
        device = plugin.get(f"offload_{block}_device")
        if device and device != "none":
            zero[f"offload_{block}"] = {
                "device": device,
                **(
                    {"nvme_path": plugin[f"offload_{block}_nvme_path"]}
                    if plugin.get(f"offload_{block}_nvme_path")
                    else {}
                ),
            }
    if plugin.get("gradient_clipping") not in (None, "none"):
        config["gradient_clipping"] = _number(plugin["gradient_clipping"], "gradient_clipping", path, float, 1e6)
    if plugin.get("gradient_accumulation_steps") not in (None, "auto"):
        config["gradient_accumulation_steps"] = _number(
            plugin["gradient_accumulation_steps"], "gradient_accumulation_steps", path
        )
    if plugin.get("zero3_save_16bit_model"):
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    precision = str(data.get("mixed_precision") or "no").lower()
    if precision in ("fp16", "bf16"):
        config[precision] = {"enabled": True}
    return config


@dataclass
class AccelerateTarget(Target):
    """A script started by ``accelerate launch`` with a DeepSpeed plugin."""

    command: UserCommand
    launch: AccelerateLaunch
    kind = "an Accelerate script, started by accelerate launch"

    def output_files(self) -> tuple[str, ...]:
        return (OPTIMAL_YAML,)

    def __post_init__(self) -> None:
        self.config_file, self.accelerate_config = read_accelerate_config(self.launch)
        if self.engine == "fsdp":
            from ..request import deepspeed_space

            self.source = deepspeed_space(self.fsdp_settings({}).mixed_precision)
        else:
            self.source = ds_config_of(self.config_file, self.accelerate_config, self.launch)

    @property
    def engine(self) -> str:
        """``fsdp`` where the Accelerate config trains with FSDP2."""
        kind = str(self.accelerate_config.get("distributed_type", "")).upper()
        return "fsdp" if kind == "FSDP" and "--use_deepspeed" not in self.launch.options else "deepspeed"

    def config_source(self, given):
        return given if given is not None else self.source

    def check_cluster(self, cluster) -> None:
        machines = _number(self.accelerate_config.get("num_machines") or 1, "num_machines", self.config_file)
        if cluster.multinode or machines > 1:
            raise ConfigError(
                "zerotune tunes Accelerate scripts on one node; tune with num_machines: 1 (and no "
                "--num-nodes or hostfile), then train on your nodes with the tuned config"
            )

    def processes(self, num_gpus: int | None) -> int | None:
        asked = self.launch.option("--num_processes") or self.accelerate_config.get("num_processes")
        if asked is None:
            return num_gpus
        per_node = _number(asked, "num_processes", self.config_file)
        if num_gpus is not None and num_gpus != per_node:
            raise ConfigError(
                f"--num-gpus {num_gpus} disagrees with the Accelerate config's num_processes {asked}; give one of them"
            )
        return per_node

    def arg_mappings(self, config: dict[str, Any], given: dict[str, str] | None) -> dict[str, str]:
        try:
            text = Path(self.script).read_text(errors="replace")
        except OSError:
            text = ""
        declared = {k: flag for k, flag in SCRIPT_OPTIONS.items() if re.search(re.escape(flag) + r"\b", text)}
        mappings = {**declared, **(given or {})}
        if "train_micro_batch_size_per_gpu" not in mappings and not isinstance(
            config.get("train_micro_batch_size_per_gpu"), int
        ):
            raise ConfigError(
                "Accelerate takes the micro-batch from the script's DataLoader: name the script's "
                'batch-size option in the ds_config, "autotuning": {"arg_mappings": '
                '{"train_micro_batch_size_per_gpu": "--batch_size"}}'
            )
        return mappings

    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        return self.command.trial_args(None, mapped)  # the config reaches Accelerate through its own env

    def probe_fields(self, config: Path) -> dict[str, Any]:
        return {"accelerate": True, "env": {"ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config.resolve())}}

    def launch_config(self, ds_config: Path, num_gpus: int) -> dict[str, Any]:
        """The user's Accelerate config naming ``ds_config``, for ``num_gpus`` processes per node:
        DeepSpeed from the file only (Accelerate refuses its keys beside one)."""
        data = {k: v for k, v in self.accelerate_config.items() if k not in ("mixed_precision", "fsdp_config")}
        plugin = {k: v for k, v in (data.get("deepspeed_config") or {}).items() if k not in INLINE_KEYS}
        plugin["deepspeed_config_file"] = str(ds_config.resolve())
        data.update(distributed_type="DEEPSPEED", deepspeed_config=plugin, num_processes=num_gpus, num_machines=1)
        return data

    def write_launch_config(self, path: Path, ds_config: Path, num_gpus: int) -> Path:
        return write_yaml(path, self.launch_config(ds_config, num_gpus))

    @property
    def fsdp(self):
        from ._fsdp_forms import AccelerateFsdp

        return AccelerateFsdp(self)

    def fsdp_settings(self, ds_config: dict[str, Any], wrap: tuple[str, ...] = ()):
        """The precision of the Accelerate config (``mixed_precision``), the same under either engine."""
        from ..request import FsdpSettings

        own = self.accelerate_config.get("fsdp_config") if self.engine == "fsdp" else None
        classes = (own or {}).get("fsdp_transformer_layer_cls_to_wrap") if isinstance(own, dict) else None
        if not wrap and isinstance(classes, str):
            wrap = tuple(c.strip() for c in classes.split(",") if c.strip())
        precision = str(self.accelerate_config.get("mixed_precision") or "no").lower()
        if precision not in ("bf16", "fp16"):
            return super().fsdp_settings(ds_config, wrap)
        return FsdpSettings(wrap=wrap, mixed_precision=precision)

    def program_launcher(self, root: Path, ds_config: Path, num_gpus: int) -> AccelerateLauncher:
        """accelerate launch for the trials, with zerotune's launch config (in the results
        folder) and the user's other options."""
        path = self.write_launch_config(work_folder(root) / "launch.yaml", ds_config, num_gpus)
        return AccelerateLauncher(options=("--config_file", str(path.resolve()), *self.launch.kept_options()))

    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster) -> str:
        num_gpus = cluster.num_gpus
        yaml_path = self.write_launch_config(optimal.parent / OPTIMAL_YAML, optimal, num_gpus)
        words = [
            "accelerate",
            "launch",
            "--config_file",
            str(yaml_path.resolve()),
            *self.launch.kept_options(),
            self.script,
            *self.trial_args(optimal, mapped),
        ]
        return " ".join(cluster.env_words() + [shlex.quote(w) for w in words]) + "\n"

    def identity(self) -> tuple[str, list[str]]:
        import json

        code, args = super().identity()
        # The launch config as it is measured: the ds_config file's path aside (its content is
        # each trial's own identity).
        normalized = self.launch_config(Path("<ds_config>"), 0)
        normalized["deepspeed_config"]["deepspeed_config_file"] = "<ds_config>"
        return code, [
            *args,
            "accelerate",
            *self.launch.kept_options(),
            json.dumps(normalized, sort_keys=True, default=str),
        ]
