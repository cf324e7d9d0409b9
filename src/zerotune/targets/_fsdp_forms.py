"""How a target runs an FSDP2 trial and trains with an FSDP2 choice: its engine form.

A target whose framework chooses the engine outside the script (the Hugging Face Trainer's
``--fsdp``, Accelerate's config) has an :class:`FsdpForm` (``Target.fsdp``). It answers what the
target answers for a DeepSpeed trial, with the same methods: the script's arguments, what the
probe sets, the launcher, the config in the framework's form and the final command. Each is
given zerotune's FSDP2 config of the trial (see zerotune.request's ``fsdp_config``), or its
file ``config``.

On CPU, Accelerate runs FSDP2 only with zerotune's lift (zerotune.accelerate_cpu): the trials install
it, and a CPU command sets ``ACCELERATE_USE_CPU=true`` and puts its ``sitecustomize.py`` first on
the ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..accelerate_cpu import CPU_ENV, write_site
from ._accelerate_files import AccelerateLauncher, work_folder, write_yaml
from ._command import CONFIG_FLAGS, UserCommand

if TYPE_CHECKING:
    from ..launch import Cluster

OPTIMAL = "fsdp_config_optimal.json"


class FsdpForm:
    """An FSDP2 trial of a target, and the command that trains with one (see the module's docs).
    Methods, with the signatures of :class:`~zerotune.targets.Target`'s: :meth:`trial_args`,
    :meth:`probe_fields`, :meth:`program_launcher`, :meth:`final_config`, :meth:`final_command`."""

    optimal_file = OPTIMAL
    """Where the chosen configuration's :meth:`final_config` is written."""

    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        raise NotImplementedError

    def probe_fields(self, config: Path) -> dict[str, Any]:
        return {"engine": "fsdp", "accelerate": True}

    def program_launcher(self, root: Path, config: Path, num_gpus: int):
        return None

    def final_config(self, config: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster: Cluster) -> str:
        raise NotImplementedError


def cpu_env_words(cluster: Cluster, root: Path) -> list[str]:
    """On CPU, what lets the command's processes run FSDP2 (see the module's docs); else none."""
    if cluster.device != "cpu":
        return []
    site = write_site(root)
    return [f"{k}={shlex.quote(v)}" for k, v in CPU_ENV.items()] + [f"PYTHONPATH={shlex.quote(str(site.resolve()))}"]


class HfTrainerFsdp(FsdpForm):
    """The Hugging Face Trainer: ``--fsdp --fsdp_config file.json`` in place of ``--deepspeed``."""

    def __init__(self, command: UserCommand):
        self.command = command

    def final_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """zerotune's FSDP2 config as the Trainer's ``fsdp_config`` (its precision stays the
        command's ``--bf16``/``--fp16``, the accumulation its option)."""
        keys = (
            "version",
            "reshard_after_forward",
            "cpu_offload",
            "auto_wrap_policy",
            "transformer_layer_cls_to_wrap",
            "min_num_params",
        )
        return {k: config[k] for k in keys if k in config}

    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        """The user's arguments without the ds_config, with ``--fsdp --fsdp_config config``."""
        args, skip = [], False
        for i, word in enumerate(self.command.args):
            if skip:
                skip = False
                continue
            if any(word.startswith(flag + "=") for flag in CONFIG_FLAGS):
                continue
            if word in CONFIG_FLAGS and self.command.config_position() == (i + 1, False):
                skip = True
                continue
            args.append(word)
        base = UserCommand(self.command.script, tuple(args), self.command.local_rank, self.command.code)
        return [*base.trial_args(None, mapped), "--fsdp", "--fsdp_config", str(config.resolve())]

    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster: Cluster) -> str:
        args = self.trial_args(optimal, mapped)
        words = cluster.launch_words(self.command.script, args, lambda argv: False)  # torchrun: FSDP's own
        return cluster.shell_line(cluster.env_words() + cpu_env_words(cluster, optimal.parent), words) + "\n"


def accelerate_fsdp_keys(config: dict[str, Any]) -> dict[str, Any]:
    """zerotune's FSDP2 config as an Accelerate config's ``fsdp_config`` block."""
    out: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": config["reshard_after_forward"],
        "fsdp_offload_params": config["cpu_offload"],
        "fsdp_auto_wrap_policy": config["auto_wrap_policy"],
    }
    if config.get("transformer_layer_cls_to_wrap"):
        out["fsdp_transformer_layer_cls_to_wrap"] = ",".join(config["transformer_layer_cls_to_wrap"])
    if config.get("min_num_params"):
        out["fsdp_min_num_params"] = config["min_num_params"]
    return out


def accelerate_fsdp_env(config: dict[str, Any]) -> dict[str, str]:
    """What ``accelerate launch`` sets in each rank for that block: the probe sets it per trial."""
    keys = accelerate_fsdp_keys(config)
    env = {
        "ACCELERATE_USE_FSDP": "true",
        "ACCELERATE_USE_DEEPSPEED": "false",
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": str(keys["fsdp_reshard_after_forward"]).lower(),
        "FSDP_OFFLOAD_PARAMS": str(keys["fsdp_offload_params"]).lower(),
        "FSDP_AUTO_WRAP_POLICY": keys["fsdp_auto_wrap_policy"],
    }
    if "fsdp_transformer_layer_cls_to_wrap" in keys:
        env["FSDP_TRANSFORMER_CLS_TO_WRAP"] = keys["fsdp_transformer_layer_cls_to_wrap"]
    if "fsdp_min_num_params" in keys:
        env["FSDP_MIN_NUM_PARAMS"] = str(keys["fsdp_min_num_params"])
    return env


class AccelerateFsdp(FsdpForm):
    """``accelerate launch`` with an FSDP2 config in place of the DeepSpeed one: the trials start
    with one such config and the probe sets each trial's FSDP2 settings as accelerate launch
    would (:func:`accelerate_fsdp_env`); the choice is written as ``fsdp_config_optimal.json`` (the
    config's ``fsdp_config`` block) and ``accelerate_config_optimal.yaml``."""

    def __init__(self, target):
        """``target``: the AccelerateTarget (its config, launch options and command)."""
        self.target = target

    def launch_config(self, block: dict[str, Any], num_gpus: int) -> dict[str, Any]:
        """The user's Accelerate config with the FSDP2 ``block`` in place of DeepSpeed. ``use_cpu``
        is left out: accelerate launch would start plain processes without FSDP (on CPU the ranks
        are told so by ACCELERATE_USE_CPU instead)."""
        data = {k: v for k, v in self.target.accelerate_config.items() if k not in ("deepspeed_config", "use_cpu")}
        own = data.get("fsdp_config") if isinstance(data.get("fsdp_config"), dict) else {}
        # The user's other FSDP keys (state dict type, activation checkpointing) stay as they were.
        defaults = {"fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": False}
        data.update(
            distributed_type="FSDP", fsdp_config={**defaults, **own, **block}, num_processes=num_gpus, num_machines=1
        )
        return data

    def final_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return accelerate_fsdp_keys(config)

    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        return self.target.command.trial_args(None, mapped)

    def probe_fields(self, config: Path) -> dict[str, Any]:
        return {"engine": "fsdp", "accelerate": True, "env": accelerate_fsdp_env(json.loads(config.read_text()))}

    def program_launcher(self, root: Path, config: Path, num_gpus: int):
        block = accelerate_fsdp_keys(json.loads(config.read_text()))
        path = write_yaml(work_folder(root) / "launch-fsdp.yaml", self.launch_config(block, num_gpus))
        return AccelerateLauncher(options=("--config_file", str(path.resolve()), *self.target.launch.kept_options()))

    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster: Cluster) -> str:
        yaml_path = write_yaml(
            optimal.parent / "accelerate_config_optimal.yaml", self.launch_config(config, cluster.num_gpus)
        )
        words = [
            "accelerate",
            "launch",
            "--config_file",
            str(yaml_path.resolve()),
            *self.target.launch.kept_options(),
            self.target.script,
            *self.trial_args(optimal, mapped),
        ]
        env = cluster.env_words() + cpu_env_words(cluster, optimal.parent)
        return " ".join(env + [shlex.quote(w) for w in words]) + "\n"
