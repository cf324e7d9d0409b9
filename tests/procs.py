"""Process and shared-memory checks for tests and benchmarks that run real trials."""
import os
from pathlib import Path


def trial_processes(results_dir) -> list[int]:
    """Processes started for a trial under ``results_dir`` (their environment names its probe.json)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if f"ZEROTUNE_PROBE={results_dir}".encode() in env:
            found.append(int(pid))
    return found


def shm_buffers() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")}
