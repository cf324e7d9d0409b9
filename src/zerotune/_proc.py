"""Process hygiene shared by the tuner and the trial processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _find_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()
"""libc's prctl, found when this module is imported, never in a child between fork and exec:
die_with_parent runs there (a Popen preexec_fn), where an import or a dlopen waits for ever on
any lock another thread of the parent held at the fork (a module being imported, the dynamic
loader's). A CI run hung 900 s in its first trial that way: the child blocked in `import ctypes`,
and Popen in the tuner waited for it to exec."""


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies, so that a tuner killed
    with SIGKILL leaves no trial behind (the launcher dies, then its ranks). No-op elsewhere.
    Linux sends it when the *thread* that started the process ends: processes that must outlive
    a worker thread (warm trials) are started from a thread that lives as long as they do.

    Safe between fork and exec: it imports nothing and loads no library (see _PRCTL)."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, sig)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def exit_file(folder: Path, rank: int) -> Path:
    """Where a rank's waiter records the signal the rank died of (see zerotune.probe, its waiter)."""
    return Path(folder) / f"rank{rank}.exit"


def read_exit(folder: Path, rank: int) -> int | None:
    """The signal rank ``rank`` died of, as its waiter recorded it, or None."""
    try:
        word, number = exit_file(folder, rank).read_text().split()
    except (OSError, ValueError):
        return None
    return int(number) if word == "signal" and number.isdigit() else None
