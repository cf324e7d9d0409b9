"""Per-process memory readings: device memory on CUDA, resident set size on CPU."""

from __future__ import annotations

import os
import resource


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """The kernel's own high-water mark of the RSS, so no peak between readings is missed:
    VmHWM, which ``/proc/self/clear_refs`` resets (``ru_maxrss`` also keeps the peak of threads
    that have exited, so a warm process could never reset it), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return max(int(line.split()[1]) * 1024, current_rss())
    except (OSError, ValueError, IndexError):
        pass
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
        "out of memory" in text.lower() or isinstance(exc, MemoryError)
    )


def reset_peak(torch_module) -> bool:
    """Start a new peak reading in this process (a warm process, before each trial): the kernel's
    high-water mark of the RSS (``/proc/self/clear_refs``, which also resets ``ru_maxrss``) and,
    where CUDA is in use, torch's peak statistics. False where the RSS peak cannot be reset:
    then peaks of later trials would include earlier ones."""
    cuda = getattr(torch_module, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        cuda.empty_cache()
        cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return peak_rss() <= current_rss() * 1.05 + (1 << 20)


def device_in_use(torch_module) -> int | None:
    """Device memory held by tensors now, where CUDA is in use; None on CPU."""
    cuda = getattr(torch_module, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        return int(cuda.memory_allocated())
    return None


def minor_faults() -> int:
    """Minor page faults of this process so far: pages its heap touched for the first time (or
    again, after glibc returned them)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
