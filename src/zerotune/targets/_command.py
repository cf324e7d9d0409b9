"""The user's training command: where its ds_config is, and how a trial rewrites it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError, LaunchError

CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", re.M)


@dataclass(frozen=True)
class UserCommand:
    script: str
    args: tuple[str, ...]
    local_rank: bool | None = None
    """Pass --local_rank to each rank; None: decide from the script's source."""
    code: tuple[str, ...] = ()
    """Files of the user's code besides the script (a function target's module)."""

    @classmethod
    def from_callable(cls, fn) -> UserCommand:
        """An in-Python entry point ``fn(ds_config: dict)``, run through zerotune's entry script."""
        import sys

        from . import _entry as entry

        file = getattr(sys.modules.get(fn.__module__), "__file__", None)
        return cls(entry.__file__, tuple(entry.entry_args(fn)), local_rank=False, code=(file,) if file else ())

    def code_files(self) -> list[Path]:
        """The user's code that a trial runs, as far as it is found cheaply: the script (or the
        function's module) and the modules it imports from its own folder."""
        files = [Path(self.script), *map(Path, self.code)]
        out: list[Path] = []
        for f in files:
            out.append(f)
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            for name in sorted(set(_IMPORT.findall(text))):
                for candidate in (f.parent / f"{name}.py", f.parent / name / "__init__.py"):
                    if candidate.is_file() and candidate not in out:
                        out.append(candidate)
        return out

    def code_identity(self) -> str:
        """A hash of :meth:`code_files`' contents: an edit to the model changes it, moving the
        folder does not."""
        import hashlib

        h = hashlib.sha256()
        for f in self.code_files():
            try:
                h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
            except OSError:
                h.update(f.name.encode() + b"\0missing\0")
        return h.hexdigest()[:16]

    def identity_args(self) -> list[str]:
        """The arguments as they matter to what a trial measures: the ds_config's path is left
        out (its content is part of each trial's identity), so moving the file changes nothing."""
        return self.trial_args("<ds_config>") if self.config_position() is not None else list(self.args)

    @classmethod
    def parse(cls, command: list[str] | tuple[str, ...]) -> UserCommand:
        if not command:
            raise ConfigError(
                "no training script given; usage: zerotune tune [options] script.py "
                "--deepspeed_config ds.json [script args]"
            )
        script, *args = command
        path = Path(script)
        if path.name in ("accelerate", "deepspeed", "torchrun") and not path.is_file():
            raise ConfigError(
                f"give the training script itself, not the {path.name} launcher: zerotune starts the "
                "processes (usage: zerotune tune [--num-gpus N] train.py [args], or zerotune tune "
                "accelerate launch --config_file acc.yaml train.py [args])"
            )
        if path.is_dir():
            raise LaunchError(f"training script {script!r} is a folder; give the path of the .py script in it")
        if path.exists() and not path.is_file():
            raise LaunchError(
                f"training script {script!r} is not a regular file (a pipe or a device); give the "
                "path of your .py script"
            )
        if not path.is_file():
            raise LaunchError(
                f"training script {script!r} does not exist; give the path of your DeepSpeed "
                "training script (relative to this folder or absolute)"
            )
        if path.suffix != ".py":
            raise ConfigError(f"training script {script!r} is not a .py file; zerotune runs Python scripts")
        command = cls(str(path), tuple(args))
        if len(given := command.config_values()) > 1:
            raise ConfigError(
                f"the ds_config is given {len(given)} times ({', '.join(given)}); the script reads only "
                "the last, so give the config option once"
            )
        return command

    def config_values(self) -> list[str]:
        """Every ds_config path the arguments give (``--deepspeed_config`` or ``--deepspeed``)."""
        found = []
        for i, a in enumerate(self.args):
            if any(a.startswith(flag + "=") for flag in CONFIG_FLAGS):
                found.append(a)
            elif a in CONFIG_FLAGS and self._holds_path(a, i):
                found.append(f"{a} {self.args[i + 1]}")
        return found

    def _holds_path(self, flag: str, i: int) -> bool:
        """Whether ``flag`` at ``i`` is followed by a config path (HF-style ``--deepspeed
        ds.json``; DeepSpeed's own ``--deepspeed`` is a switch)."""
        if i + 1 >= len(self.args):
            return False
        value = self.args[i + 1]
        return flag == "--deepspeed_config" or value.endswith(".json") or Path(value).is_file()

    def config_position(self) -> tuple[int, bool] | None:
        """Index of the ds_config path in args, and whether it is joined (``--flag=path``)."""
        for i, a in enumerate(self.args):
            for flag in CONFIG_FLAGS:
                if a.startswith(flag + "="):
                    return i, True
                if a == flag and self._holds_path(flag, i):
                    return i + 1, False
        return None

    def config_path(self) -> str | None:
        pos = self.config_position()
        if pos is None:
            return None
        i, joined = pos
        return self.args[i].split("=", 1)[1] if joined else self.args[i]

    def trial_args(self, config_path: str | None, mapped: dict[str, str] | None = None) -> list[str]:
        """The user's args, untouched except the ds_config path and the ``arg_mappings`` values.
        ``config_path`` None: the config reaches the script another way (Lightning)."""
        args = list(self.args)
        pos = self.config_position()
        if config_path is None:
            pass
        elif pos is None:
            args += ["--deepspeed_config", config_path]
        else:
            i, joined = pos
            args[i] = args[i].split("=", 1)[0] + "=" + config_path if joined else config_path
        for flag, value in (mapped or {}).items():
            args = _set_arg(args, flag, value)
        return args

    def option_value(self, flag: str) -> str | None:
        """The value the user's args give ``flag`` (see :func:`option_value`), or None."""
        return option_value(self.args, flag)

    def takes_local_rank(self) -> bool:
        """Scripts that declare --local_rank (or use HF's TrainingArguments) get it per rank."""
        if self.local_rank is not None:
            return self.local_rank
        try:
            text = Path(self.script).read_text(errors="replace")
        except OSError:
            return False
        return bool(re.search(r"local[_-]rank|TrainingArguments|HfArgumentParser", text))


def option_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag v`` or ``--flag=v``; the last one wins, as
    argparse reads it), or None."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _set_arg(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with every occurrence of ``flag`` given ``value`` (argparse reads the last one),
    or with ``flag value`` added where it is absent."""
    out, found, i = [], False, 0
    while i < len(args):
        a = args[i]
        if a == flag and i + 1 < len(args):
            out += [flag, value]
            found, i = True, i + 2
            continue
        if a.startswith(flag + "="):
            a, found = f"{flag}={value}", True
        out.append(a)
        i += 1
    return out if found else out + [flag, value]
