"""Which kind of target a training command is: the one module that knows every kind (a script,
a function, a Hugging Face Trainer script, an ``accelerate launch`` command, a Lightning
program), so that the core and the target base class name none of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ._base import ScriptTarget, Target
from ._command import UserCommand


def detect(
    command: list[str] | Callable[[dict[str, Any]], Any],
    ds_config: Any,
    *,
    inspect_dir: Path,
    env: dict[str, str],
) -> Target:
    """The target of ``command`` (the user's words, or a function ``train(ds_config)``): an
    ``accelerate launch ...`` command; a Lightning script found by running it up to
    ``trainer.fit`` (when no ds_config is given), in ``inspect_dir`` with ``env``; a Hugging Face
    Trainer script (read from its source); else a script or a function."""
    from ._accelerate import AccelerateLaunch, AccelerateTarget, is_accelerate_launch
    from ._hf_trainer import HfTrainerTarget, looks_like_hf_trainer
    from ._lightning_program import LightningTarget, inspect_script, looks_like_lightning

    if callable(command):
        return ScriptTarget(command=UserCommand.from_callable(command))
    if is_accelerate_launch(command):
        launch = AccelerateLaunch.split(command)  # `accelerate launch [options] script.py ...`
        return AccelerateTarget(command=UserCommand.parse(list(launch.script_command)), launch=launch)
    user = UserCommand.parse(command)
    if ds_config is None and user.config_path() is None and looks_like_lightning(user.script):
        return LightningTarget(command=user, job=inspect_script(user.script, list(user.args), inspect_dir, env))
    if looks_like_hf_trainer(user.script):
        return HfTrainerTarget(command=user)
    if ds_config is None and user.config_path() is None and _shards_itself(user.script):
        raise ConfigError(
            f"{user.script} applies fully_shard itself and names no ds_config: zerotune tunes FSDP2 where the "
            "Hugging Face Trainer or Accelerate applies it (--engines fsdp), and a script that calls "
            "deepspeed.initialize with --deepspeed_config ds.json; train this one through Accelerate's FSDP2 "
            "config, or give it a ds_config"
        )
    return ScriptTarget(command=user)


def _shards_itself(script: str) -> bool:
    """The script's source calls ``fully_shard`` (read, not run)."""
    try:
        return "fully_shard(" in Path(script).read_text(errors="replace")
    except OSError:
        return False
