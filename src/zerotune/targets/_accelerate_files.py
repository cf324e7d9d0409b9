"""What Accelerate's launches are made of: the config files zerotune writes for them (in the
results folder) and the launcher that starts a trial's ranks with ``accelerate launch``. Shared by
the DeepSpeed and the FSDP2 form of an Accelerate target."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..launch import ProgramLauncher

WORK = "_accelerate"
"""zerotune's folder in the results folder: the launch configs of the trials."""


def yaml_module():
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            "reading an Accelerate config needs PyYAML; install zerotune's hf extra: pip install 'zerotune[hf]'"
        ) from None
    return yaml


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    """``data`` as an Accelerate config file at ``path``."""
    from .._files import write_atomic

    write_atomic(path, yaml_module().safe_dump(data, sort_keys=False))
    return path


def work_folder(root: Path) -> Path:
    """zerotune's folder in the results folder ``root`` for the trials' launch configs, made
    where missing (a link or file of that name there is replaced, never followed)."""
    work = root / WORK
    if work.is_symlink() or (work.exists() and not work.is_dir()):
        work.unlink()
    work.mkdir(parents=True, exist_ok=True)
    return work


@dataclass(frozen=True)
class AccelerateLauncher(ProgramLauncher):
    """The ranks of a trial started by Accelerate's launcher (``accelerate launch``) instead of
    DeepSpeed's: for programs whose users start them so, with their Accelerate config."""

    options: tuple[str, ...]
    """accelerate launch's options: its config file and the user's other options."""

    def argv(self, num_gpus: int, port: int, devices: list[int] | None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            *self.options,
            "--num_processes",
            str(num_gpus),
            "--num_machines",
            "1",
            "--main_process_port",
            str(port),
            *(["--gpu_ids", ",".join(map(str, devices))] if devices else []),
            "--module",
            "zerotune.probe",
        ]
