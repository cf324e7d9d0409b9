"""Build locks that torch's extension cache may hold: DeepSpeed compiles its ops (cpu_adam, its
shared-memory allreduce, ...) at first use under torch's cpp_extension, which waits, silently
and without end, while a ``lock`` file exists in the op's build folder. A build that was killed
(Ctrl-C, a stopped test run) leaves it behind, and every later trial then waits on it until its
trial timeout. zerotune only reads that folder: deleting a lock that a running build holds
would break that build, so the user is told where it is."""

from __future__ import annotations

import os
from pathlib import Path


def build_locks() -> list[Path]:
    """The build locks in torch's extension cache. torch builds an op in ``TORCH_EXTENSIONS_DIR/<op>``
    where that is set, else in ``<its default root>/<python>_<device>/<op>``; the default root is
    torch's own answer (``get_default_build_root``: XDG_CACHE_HOME, else ~/.cache). torch is
    imported only here, on the path of a trial that timed out without a forward."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    try:
        if given:
            return sorted(Path(given).glob("*/lock"))
        from torch.utils.cpp_extension import get_default_build_root

        return sorted(Path(get_default_build_root()).glob("*/*/lock"))
    except (OSError, ImportError):
        return []


def lock_hint() -> str:
    """A sentence naming the build locks a trial that never started may have waited on; "" if none."""
    locks = build_locks()
    if not locks:
        return ""
    named = ", ".join(str(p) for p in locks[:3]) + (f" and {len(locks) - 3} more" if len(locks) > 3 else "")
    return (
        f"; no rank reported before the timeout, and torch's extension cache holds a build lock ({named}): "
        "DeepSpeed's op build waits on it for ever. If no other build is running, a killed one left it: "
        "delete it and run again"
    )
