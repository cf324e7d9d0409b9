"""Where am I: device type, count and memory of this node (torch imported only when asked)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    device: str
    """"cuda" or "cpu"."""
    device_count: int
    device_memory: int | None
    """Bytes per device (CUDA), or None on CPU."""
    host_memory: int


def host_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def detect_node() -> Node:
    if os.environ.get("DS_ACCELERATOR", "cuda") == "cpu":
        return Node("cpu", os.cpu_count() or 1, None, host_memory())
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return Node("cuda", torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory, host_memory())
    return Node("cpu", os.cpu_count() or 1, None, host_memory())
