"""How many processes the kernel's out-of-memory killer has ended in this process's memory
cgroup: read before and after a trial, the difference tells a rank the kernel killed for memory
from one killed from outside (a user's ``kill -9``, a watchdog, a scheduler).

cgroup v2 counts kills in ``memory.events`` (``oom_kill``), v1 in ``memory.oom_control``; both
count every kind of OOM kill (the cgroup's limit or the whole host's) against the victim's
cgroup and its ancestors, and trial processes start in the tuner's cgroup.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def _count(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def oom_kill_count(own: Path = Path("/proc/self/cgroup"), fs: Path = CGROUP_FS) -> int | None:
    """The OOM kill count of this process's memory cgroup, or None where it cannot be read."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            places = (fs / path.lstrip("/") / "memory.events", fs / "memory.events")
        elif "memory" in controllers.split(","):
            places = (fs / "memory" / path.lstrip("/") / "memory.oom_control", fs / "memory" / "memory.oom_control")
        else:
            continue
        for place in places:  # the cgroup's own file, else the root a cgroup namespace shows
            if (count := _count(place)) is not None:
                return count
    return None


def oom_kills_since(before: int | None) -> int | None:
    """OOM kills counted since ``before`` was read (None: unknown)."""
    after = oom_kill_count()
    return None if before is None or after is None else max(0, after - before)
