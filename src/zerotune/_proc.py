"""Process hygiene shared by the tuner and the trial processes."""
from __future__ import annotations

import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies, so that a tuner killed
    with SIGKILL leaves no trial behind (the launcher dies, then its ranks). No-op elsewhere.
    Linux sends it when the *thread* that started the process ends: processes that must outlive
    a worker thread (warm trials) are started from a thread that lives as long as they do."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
