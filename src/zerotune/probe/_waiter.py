"""How a rank's process ended, written where the tuner reads it.

A rank killed by a signal cannot say so itself, and DeepSpeed's launcher logs the exit status of
one process only: the first it finds dead, often a peer that failed a moment later in a broken
collective. So each rank runs as the child of a small waiter (forked before anything heavy is
imported): the waiter forwards the signals it is sent, and where its child dies of a signal it
writes ``rank<N>.exit`` ("signal 9") beside the rank's other files, then ends by the same signal,
so that the launcher sees what it would have seen without it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from .._proc import die_with_parent, exit_file

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run_watched(folder: Path, rank: int) -> None:
    """Fork: the child returns and runs the rank; this process waits for it, records how it
    died, and ends as it did (it never returns)."""
    child = os.fork()
    if child == 0:
        die_with_parent()  # the waiter killed outright (SIGKILL) takes its rank with it
        return
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: _forward(child, signum))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            path = exit_file(folder, rank)
            path.write_text(f"signal {sig}\n")
        except OSError:
            pass  # the verdict falls back to the launcher's log
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled, nor reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal this process cannot die of (never for SIGKILL or SIGTERM)
    os._exit(os.WEXITSTATUS(status))


def _forward(child: int, signum: int) -> None:
    try:
        os.kill(child, signum)
    except ProcessLookupError:
        pass
