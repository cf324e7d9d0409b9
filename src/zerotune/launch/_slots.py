"""Where concurrent trials run: disjoint device groups, one per trial at a time; across the
hosts of a hostfile, disjoint groups of hosts (see Cluster.slots).

With D devices on the node and trials of g processes, D // g trials run at once, each on its own
GPUs (DeepSpeed's launcher sets CUDA_VISIBLE_DEVICES from the ids it is given) and its own master
port. On CPU the default is one trial at a time, using every core, because that is how the job
will train: trials squeezed onto a share of the cores would rank configurations under a thread
count the real run never uses. ``max_concurrent`` > 1 on CPU pins each trial to its own cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._errors import ConfigError
from ._hosts import Host


@dataclass(frozen=True)
class Slot:
    index: int
    devices: tuple[int, ...]
    """GPU ids as this machine numbers them (what CUDA_VISIBLE_DEVICES lists); on CPU, core ids."""
    pinned: bool = False
    """CPU only: the trial's processes are bound to ``devices`` (cores) and share only them."""
    hosts: tuple[Host, ...] = ()
    """A multi-node trial's hosts and their slots (empty: this node)."""


def visible_gpus(count: int) -> list[int]:
    """The GPUs this process may use, by their machine-wide ids."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        ids = [int(x) for x in listed.split(",") if x.strip().isdigit()]
        if ids:
            return ids[:count] if count else ids
    return list(range(count))


def cpu_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def plan_slots(device: str, device_count: int, per_trial: int, max_concurrent: int | None) -> list[Slot]:
    """The slots trials run in. ``max_concurrent`` None: as many as the devices allow (GPU), one (CPU)."""
    if max_concurrent is not None and max_concurrent < 1:
        raise ConfigError(f"--max-concurrent-trials must be at least 1, not {max_concurrent}")
    if device == "cuda":
        gpus = visible_gpus(device_count)
        n = len(gpus) // per_trial
        n = max(1, min(n, max_concurrent or n))
        return [Slot(i, tuple(gpus[i * per_trial : (i + 1) * per_trial])) for i in range(n)]
    cores = cpu_cores()
    n = min(max_concurrent or 1, max(1, len(cores) // per_trial))
    if n == 1:
        return [Slot(0, tuple(cores))]
    share = len(cores) // n
    return [Slot(i, tuple(cores[i * share : (i + 1) * share]), pinned=True) for i in range(n)]
