"""What trials leave behind, found from what cannot go stale and ended: processes and DeepSpeed's
shared-memory buffers.

Trial processes normally end with their tuner (each asks Linux for a signal when its parent
dies, and each trial's process group is ended as one), but a rank that ignores SIGTERM, or a
daemon a script started in a session of its own, lives on and would take the next tuning's
orders or hold memory. Every trial process carries, in its environment, the absolute results
folder (``ZEROTUNE_RESULTS``) and its tuner's pid (``ZEROTUNE_TUNER_PID``); children inherit
both, whatever session or group they move to. Found by the results folder, they are ended:

- at the start of a tuning, which holds the folder's lock, so that no other tuner of the folder
  is alive: every trial process of the folder that is not its own is left over;
- by ``zerotune show`` where no tuning holds the lock;
- at the end of a tuning: its own trial processes still alive once its launcher ended them.

DeepSpeed's CPU backend makes two shared-memory buffers per job (about 66 MB each, named by the
rendezvous address and port) and never unlinks them. Each port a trial uses is noted in the
results folder before its processes start; buffers of those ports that no living process maps
are removed by the next tuning of the folder.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

RESULTS_ENV = "ZEROTUNE_RESULTS"
TUNER_PID = "ZEROTUNE_TUNER_PID"
PORTS = "_shm_ports.txt"
SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def _environ(pid: str) -> dict[str, str]:
    try:
        raw = (PROC / pid / "environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _command(pid: int) -> str:
    try:
        words = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    return " ".join(w for w in words if w)[:80]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purpose
        return (PROC / str(pid) / "stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def trial_env_marks(results_dir: Path) -> dict[str, str]:
    """What a trial's processes carry in their environment to be found later."""
    return {RESULTS_ENV: str(Path(results_dir).resolve()), TUNER_PID: str(os.getpid())}


def leftovers(results_dir: Path, *, own: bool = False) -> list[Leftover]:
    """Trial processes of ``results_dir``: of another tuner (``own`` False; call with the
    folder's lock held, where any other tuner of it is dead), or of this process's tuning
    (``own`` True; after its launcher ended every trial). A ``zerotune run`` training carries
    no tuner pid and is never one."""
    root = str(Path(results_dir).resolve())
    me = os.getpid()
    found = []
    if not PROC.is_dir():
        return found
    for pid in filter(str.isdigit, os.listdir(PROC)):
        if int(pid) == me:
            continue
        env = _environ(pid)
        tuner = env.get(TUNER_PID, "")
        if env.get(RESULTS_ENV) != root or not tuner.isdigit() or (int(tuner) == me) != own:
            continue
        if alive(int(pid)):
            found.append(Leftover(int(pid), _command(int(pid))))
    return found


def end(found: list[Leftover], grace: float = 1.0) -> list[Leftover]:
    """End ``found``: SIGTERM, then SIGKILL after ``grace`` seconds for those still alive.
    Returns ``found``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for p in found:
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(alive(p.pid) for p in found):
            time.sleep(0.05)
        if not any(alive(p.pid) for p in found):
            break
    return found


def end_leftovers(results_dir: Path, *, own: bool = False) -> list[Leftover]:
    """End the leftover processes of ``results_dir`` (see :func:`leftovers`), then remove the
    shared-memory buffers of its dead trials; returns the processes ended."""
    ended = end(leftovers(results_dir, own=own))
    if not own:
        remove_dead_buffers(results_dir)
    return ended


def leftovers_line(ended: list[Leftover], who: str) -> str | None:
    """The summary's line naming the processes that had to be ended, or None."""
    if not ended:
        return None
    shown = ", ".join(f"{p.pid} ({p.command})" for p in ended[:4]) + (" ..." if len(ended) > 4 else "")
    return f"ended {len(ended)} process(es) that {who} left running: {shown}"


# -- shared-memory buffers -------------------------------------------------------------------


def buffers(port: int, addr: str = "127.0.0.1", shm_dir: Path = SHM_DIR) -> list[Path]:
    """The shared-memory allreduce buffers DeepSpeed's CPU backend made for the job on ``addr:port``."""
    return sorted(shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_*"))


def remove_shm_buffers(port: int, addr: str = "127.0.0.1", shm_dir: Path = SHM_DIR) -> int:
    """Remove the buffers of the job on ``addr:port`` (about 66 MB per rank, which DeepSpeed never
    unlinks: without this every trial on CPU would leave them until the machine runs out of memory)."""
    removed = 0
    for path in buffers(port, addr, shm_dir):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def note_port(results_dir: Path, port: int, addr: str = "127.0.0.1") -> None:
    """Note, before a trial's processes start, the port whose buffers its job will make, so that
    a tuner killed before its clean-up leaves them to the next tuning to remove."""
    with open(Path(results_dir) / PORTS, "a", encoding="utf-8") as f:
        f.write(f"{addr} {port}\n")


def _mapped() -> set[str]:
    """Names of the files under /dev/shm that a living process maps."""
    names: set[str] = set()
    for pid in filter(str.isdigit, os.listdir(PROC)) if PROC.is_dir() else ():
        try:
            maps = (PROC / pid / "maps").read_text(errors="replace")
        except OSError:
            continue
        names.update(line.rsplit("/", 1)[-1] for line in maps.splitlines() if " /dev/shm/" in line)
    return names


def remove_dead_buffers(results_dir: Path, shm_dir: Path = SHM_DIR) -> int:
    """Remove the buffers of the ports noted in ``results_dir`` that no living process maps (a
    port another job reuses now keeps its buffers), and forget the noted ports."""
    ledger = Path(results_dir) / PORTS
    try:
        lines = ledger.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    removed = 0
    in_use = None
    for line in dict.fromkeys(lines):
        addr, _, port = line.partition(" ")
        if not port.isdigit():
            continue
        found = buffers(int(port), addr, shm_dir)
        if found and in_use is None:
            in_use = _mapped()
        for path in found:
            if path.name not in (in_use or set()):
                try:
                    path.unlink()
                    removed += 1
                except OSError:
                    pass
    try:
        ledger.unlink()
    except OSError:
        pass
    return removed
