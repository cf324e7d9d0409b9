"""Per-process memory readings: device memory on CUDA, resident set size on CPU."""
from __future__ import annotations

import os
import resource


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    # ru_maxrss (KiB on Linux) is the kernel's own high-water mark, so no peak between readings is missed.
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, current_rss())


class MemoryReader:
    """Reads memory of this process on its device: ``kind`` is "cuda" or "cpu-rss"."""

    def __init__(self, device_type: str, torch_module=None):
        self.kind = "cuda" if device_type == "cuda" else "cpu-rss"
        self._torch = torch_module

    def current(self) -> int:
        if self.kind == "cuda":
            return int(self._torch.cuda.memory_allocated())
        return current_rss()

    def peak(self) -> int:
        """Peak of what decides an OOM: reserved (cached) device memory, or peak RSS."""
        if self.kind == "cuda":
            return int(self._torch.cuda.max_memory_reserved())
        return peak_rss()

    def peak_allocated(self) -> int:
        if self.kind == "cuda":
            return int(self._torch.cuda.max_memory_allocated())
        return peak_rss()


def is_oom_error(exc: BaseException) -> bool:
    """A device out-of-memory error, by type where torch has one, else by its message."""
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "OutOfMemory"):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in text.lower() or isinstance(exc, MemoryError))
