"""The results folder: which folders are zerotune's, what ``--overwrite`` removes, and one tuning
at a time in each.

zerotune writes only inside a results folder it owns, and deletes only what it made there:

- A folder is zerotune's when its ``tuning.json`` says so (the ``zerotune`` key), or when it
  holds nothing but what a tuning writes before its record (:data:`BEFORE_RECORD`). A
  ``tuning.json`` too damaged to read still marks the folder as zerotune's where the folder's
  lock file is beside it. Any other non-empty folder is refused, with what is in it named.
- ``--overwrite`` removes the trial folders the record lists under ``made`` and the output files
  (:func:`outputs`), nothing else: a user's subfolder in a results folder stays.
- A tuning holds the folder's lock (``.zerotune.lock``, an advisory ``flock`` that the kernel
  releases when the process dies, however it dies); a second tuning of the same folder is
  refused with the pid of the one running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from .._errors import ConfigError, ZerotuneError
from .._files import make_folder
from ._store import SESSION

__all__ = ["FolderBusyError", "FolderLock", "busy", "claim", "discard", "expand", "make_folder", "made"]

MARK = "zerotune"
"""The key of tuning.json that makes its folder zerotune's (its value: the writer's version)."""
LOCK = ".zerotune.lock"
OUTPUTS = (
    "ds_config_optimal.json",
    "fsdp_config_optimal.json",
    "cmd_optimal.txt",
    "summary.txt",
    "results.json",
    "sbatch_optimal.sh",
)
"""The output files a tuning writes at the results folder's top (one of the two configs, of the
engine chosen; ``sbatch_optimal.sh`` under Slurm only); a target's own (its
Target.output_files) are listed in the record under ``target_outputs``."""
NOT_TRIALS = frozenset({SESSION, "run_probe.json", "report", "report.html", *OUTPUTS})
"""Fixed names at the results folder's top that are not trial folders (zerotune's other folders
and files there begin with "_" or ".")."""
BEFORE_RECORD = frozenset({LOCK, "_inspect", "_cpu_info.json"})  # the Lightning inspection, DeepSpeed's CPU answer
"""What a tuning may have written before its tuning.json (a folder holding only these is zerotune's)."""


class FolderBusyError(ZerotuneError):
    """Another tuning holds the results folder."""


def expand(path: str | Path) -> Path:
    """A results folder as given (option, config or argument), ``~`` and ``$VAR`` expanded as
    a shell would; a variable that is not set is refused rather than made a literal folder."""
    text = os.path.expandvars(os.path.expanduser(str(path)))
    if text.startswith("~") or re.search(r"\$(\w+|\{[^}]*\})", text):
        raise ConfigError(
            f"the results folder {str(path)!r} names a home folder or variable that is not set "
            f"({text!r} after expansion); give a plain path"
        )
    return Path(text)


def _entries(root: Path) -> list[str]:
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError as e:
        raise ConfigError(
            f"cannot read the results folder {root}: {e.strerror}; choose another --results-dir"
        ) from None


def read_record(root: Path) -> dict[str, Any] | None:
    """tuning.json of ``root`` as a JSON object, or None (missing or unreadable)."""
    try:
        data = json.loads((root / SESSION).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_zerotune_record(data: dict[str, Any] | None) -> bool:
    """A tuning.json that zerotune wrote: with its mark, or of a zerotune from before the mark
    (a state and a list of trials)."""
    if data is None:
        return False
    return MARK in data or (isinstance(data.get("trials"), list) and isinstance(data.get("state"), str))


def claim(root: Path) -> dict[str, Any] | None:
    """Check that zerotune may write in ``root``: absent, empty, or zerotune's. Returns the
    folder's record (None where there is none; where it is damaged, the trial folders found in
    it, see :func:`recovered`); a ConfigError names what makes a folder someone else's."""
    if not root.exists() and not root.is_symlink():
        return None
    if not root.is_dir():
        raise ConfigError(f"the results folder {root} is not a folder; choose another --results-dir")
    names = _entries(root)
    record = read_record(root)
    if is_zerotune_record(record):
        return record
    if LOCK in names and (root / SESSION).exists() and record is None:
        return recovered(root)  # zerotune's record, damaged: the tuning rebuilds it
    if all(name in BEFORE_RECORD or name.startswith(f".{SESSION}.") for name in names):
        return None  # empty, or only what a tuning writes before its record
    raise _foreign(root, names)


def _foreign(root: Path, names: list[str]) -> ConfigError:
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return ConfigError(
        f"the results folder {root} is not zerotune's: it holds {shown} and no tuning.json of "
        f"zerotune's; zerotune writes only into an empty or new folder or one of its own, so give "
        f"another --results-dir (for example {root / 'zerotune_results'})"
    )


def made(record: dict[str, Any] | None) -> set[str]:
    """The trial folders a results folder's record says zerotune made there."""
    if record is None:
        return set()
    names = record.get("made") if isinstance(record.get("made"), list) else record.get("trials")
    return {n for n in names or () if is_trial_name(n)}


def recovered(root: Path) -> dict[str, Any]:
    """A record standing in for zerotune's own damaged tuning.json: the trial folders it made,
    known by their result.json as zerotune writes it (its key and result). Read only in a
    folder that is zerotune's (its lock beside the damaged record)."""
    names = []
    for child in sorted(root.iterdir()):
        if child.is_symlink() or not child.is_dir() or not is_trial_name(child.name):
            continue
        try:
            data = json.loads((child / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and {"key", "result"} <= data.keys():
            names.append(child.name)
    return {"made": names}


def is_trial_name(name: Any) -> bool:
    """A name a trial folder can have: one plain path component, neither hidden nor one of
    zerotune's own ("_warm", "summary.txt")."""
    return (
        isinstance(name, str)
        and bool(name)
        and "/" not in name
        and "\0" not in name
        and not name.startswith((".", "_"))
        and name not in NOT_TRIALS
    )


def outputs(record: dict[str, Any] | None) -> list[str]:
    """The output files of a results folder: every tuning's, and those its record says its
    target wrote (an Accelerate config, say)."""
    extra = (record or {}).get("target_outputs")
    return list(OUTPUTS) + [n for n in (extra if isinstance(extra, list) else []) if is_trial_name(n)]


def discard(root: Path, record: dict[str, Any] | None) -> None:
    """``--overwrite``: remove the trial folders the record names and the output files, nothing
    else (a link among them goes, never what it points to)."""
    files = outputs(record)
    for name in sorted(made(record) - set(files)) + files:
        path = root / name
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir() and name not in files:
                shutil.rmtree(path)
        except OSError as e:
            raise ZerotuneError(
                f"cannot remove {path} for --overwrite: {e.strerror}; remove it yourself or "
                "choose another --results-dir"
            ) from None


class FolderLock:
    """The results folder's lock, held by one tuning from its start to its end."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = None

    def acquire(self) -> None:
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.root / LOCK), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            pid = (read_record(self.root) or {}).get("pid")
            who = f" (pid {pid})" if isinstance(pid, int) else ""
            raise FolderBusyError(
                f"another tuning{who} is running in {self.root}; wait for it to end, or give another --results-dir"
            ) from None
        except OSError as e:
            raise ZerotuneError(
                f"cannot lock the results folder {self.root}: {e.strerror}; make it writable or "
                "choose another --results-dir"
            ) from None
        self._lock = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def busy(root: Path) -> bool:
    """Whether a tuning holds ``root``'s lock now. Asked read-only, so that ``zerotune show``
    writes nothing (a shared flock conflicts with the tuning's exclusive one)."""
    import fcntl

    try:
        fd = os.open(root / LOCK, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no tuning has run here since zerotune locks its folders
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases a shared lock taken here
    return False
