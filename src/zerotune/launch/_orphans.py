"""Processes a killed tuner left behind, found and ended by the next run on the same results.

Trial processes normally end with their tuner (each one asks Linux for a signal when its parent
dies), but a rank that ignores SIGTERM, or a process that escaped its group, would live on and
hold memory or ports. Every trial process carries ``ZEROTUNE_PROBE`` (its trial folder) and
``ZEROTUNE_TUNER_PID`` in its environment, so a rerun can tell the leftovers of a dead tuner from
the trials of one still running.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TUNER_PID = "ZEROTUNE_TUNER_PID"


def _environ(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def leftovers(results_dir: Path) -> list[int]:
    """Trial processes under ``results_dir`` whose tuner is no longer alive."""
    root = str(Path(results_dir).resolve())
    found = []
    if not Path("/proc").is_dir():
        return found
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        env = _environ(pid)
        probe = env.get("ZEROTUNE_PROBE", "")
        if not probe.startswith(root + os.sep):
            continue
        tuner = env.get(TUNER_PID, "")
        # Only trials carry the tuner's pid: a `zerotune run` training on the same folder does not.
        if tuner.isdigit() and int(tuner) != os.getpid() and not _alive(int(tuner)):
            found.append(int(pid))
    return found


def reap(results_dir: Path, grace: float = 3.0) -> int:
    """End the leftovers of a dead tuner (SIGTERM, then SIGKILL); returns how many there were."""
    pids = leftovers(results_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            break
    return len(pids)
