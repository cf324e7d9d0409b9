"""Build locks that torch's extension cache may hold: DeepSpeed compiles its ops (cpu_adam, its
shared-memory allreduce, ...) at first use under torch's cpp_extension, which waits, silently
and without end, while a ``lock`` file exists in the op's build folder. A build that was killed
(Ctrl-C, a stopped test run) leaves it behind, and every later trial then waits on it until its
trial timeout. zerotune only reads that folder: deleting a lock that a running build holds
would break that build, so the user is told where it is."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


def extension_cache(env: Mapping[str, str] = os.environ) -> Path:
    """Where torch builds C++ extensions: TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions."""
    given = env.get("TORCH_EXTENSIONS_DIR")
    return Path(given) if given else Path(env.get("HOME", str(Path.home()))) / ".cache" / "torch_extensions"


def build_locks(env: Mapping[str, str] = os.environ) -> list[Path]:
    """The build locks in torch's extension cache (``<cache>/<python and device>/<op>/lock``)."""
    try:
        return sorted(extension_cache(env).glob("*/*/lock"))
    except OSError:
        return []


def lock_hint(env: Mapping[str, str] = os.environ) -> str:
    """A sentence naming the build locks a trial that never started may have waited on; "" if none."""
    locks = build_locks(env)
    if not locks:
        return ""
    named = ", ".join(str(p) for p in locks[:3]) + (f" and {len(locks) - 3} more" if len(locks) > 3 else "")
    return (f"; no rank reported before the timeout, and torch's extension cache holds a build lock ({named}): "
            "DeepSpeed's op build waits on it for ever. If no other build is running, a killed one left it: "
            "delete it and run again")
