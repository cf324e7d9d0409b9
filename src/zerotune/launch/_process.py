"""Processes of trials: their environment, DeepSpeed's per-node launcher command, a process group
ended as one, heartbeats, ports and shared-memory buffers."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .._proc import die_with_parent

if TYPE_CHECKING:
    from ._base import ProgramLauncher


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CPU_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
"""glibc's allocator settings for CPU trials: where its dynamic rule ends up. glibc serves an
allocation above its mmap threshold with a mapping of its own, and each such free raises the
threshold (up to 32 MiB, the trim threshold to twice it), so a process's allocator depends on
what it ran before: warm processes, after larger configs, served a small config's tensors from
the heap, and measured it 2-7% faster than a fresh process did, enough to pick it over a config
that fresh processes (and so the training) ran 3-5% faster. Fixed there, every trial, warm or
cold, and the final command (cmd_optimal.txt sets them) follow one rule: the same micro-batch 8
config measured in fresh processes ran 2-4% faster with them than without, in each of three
alternating rounds. (A low fixed threshold, 128 KiB, cost 10-25%: every large tensor a new
mapping.) Set only where unset, and only on Linux (glibc reads them; others ignore them)."""


FIGURE_ENV = ("DS_ACCELERATOR", "OMP_NUM_THREADS", *CPU_MALLOC)
"""The variables of a CPU trial's environment its figures depend on: named beside the choice,
set by the final command, part of a trial's identity, forwarded to other nodes."""


def trial_env(num_gpus: int, device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial's processes. On CPU: DeepSpeed's CPU accelerator, one share
    of the cores per process, so that ranks do not fight over threads, and glibc's allocator
    fixed where its dynamic thresholds end (CPU_MALLOC)."""
    env = dict(os.environ)
    if device == "cpu":
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // num_gpus)))
        if sys.platform.startswith("linux"):
            for key, value in CPU_MALLOC.items():
                env.setdefault(key, value)
    env.update(extra or {})
    return env


def launcher_argv(num_gpus: int, port: int, devices: list[int] | None = None) -> list[str]:
    """DeepSpeed's per-node launcher starting ``zerotune.probe`` on ``num_gpus`` local ranks, on
    ``devices`` (machine-wide GPU ids; DeepSpeed's launcher makes them the ranks' visible devices).
    The user's arguments are not here: the probe reads them from the trial folder."""
    ids = list(devices)[:num_gpus] if devices else list(range(num_gpus))
    world = base64.urlsafe_b64encode(json.dumps({"localhost": ids}).encode()).decode()
    return [
        sys.executable,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--no_local_rank",
        "--module",
        "zerotune.probe",
    ]


def ranks_argv(
    program: ProgramLauncher | None, num_gpus: int, port: int, devices: list[int] | None = None
) -> list[str]:
    """The command that starts a run's ranks on this node: DeepSpeed's per-node launcher, or the
    program's own launcher (a target's)."""
    if program is not None:
        return program.argv(num_gpus, port, devices)
    return launcher_argv(num_gpus, port, devices)


class ProcessGroup:
    """A child started in its own session, so that it and everything it starts can be ended
    together with one killpg."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        log: Path | None,
        cwd: str | None = None,
        cores: tuple[int, ...] | None = None,
    ):
        """``log`` None: the child writes to this process's stdout and stderr. ``cores``: bind the
        child (and so everything it starts) to these CPU cores."""
        self._log = open(log, "ab") if log is not None else None

        def prepare() -> None:
            die_with_parent()
            if cores:
                os.sched_setaffinity(0, cores)

        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT if log else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            preexec_fn=prepare,
        )

    def kill(self, grace: float = 3.0) -> None:
        """End the group: SIGTERM, then SIGKILL after ``grace`` seconds. ``grace`` 0: SIGKILL at
        once, for processes with nothing left to finish (warm ranks waiting for an order): DeepSpeed's
        launcher takes 0.8 s to handle a SIGTERM, and the ranks are ended with the group either way."""
        steps = ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)) if grace > 0 else ((signal.SIGKILL, 5.0),)
        for sig, wait in steps:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                # The leader is gone; members of its group may remain: end those too.
                os.killpg(self.proc.pid, signal.SIGKILL)
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                pass
            break
        # A killed rank lingers while the kernel frees its memory (seconds for a large one on a
        # loaded machine): return only once none is left, so that the next trial neither shares
        # the cores with it nor reads its memory as its own.
        deadline = time.monotonic() + 30.0
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._log is not None:
            self._log.close()


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of process group ``pgid`` that have not yet exited (zombies, already gone
    but for their exit status, are not counted)."""
    found = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
            found.append(int(entry.name))
    return found


def stalled(trial_dir: Path, world: int, floor: float, now: float | None = None) -> str | None:
    """Why the trial counts as hung, or None: its ranks' heartbeats (written by the probe at
    every forward and optimizer step) all older than the limit. Before the first heartbeat
    (start-up, compiling) only the trial timeout applies."""
    beats = []
    for r in range(world):
        path = trial_dir / f"rank{r}.progress"
        try:
            steps, longest = path.read_text().split()
            beats.append((path.stat().st_mtime, int(steps), float(longest)))
        except (OSError, ValueError):
            continue
    if not beats:
        return None
    limit = max(floor, 5 * max(b[2] for b in beats))
    idle = (time.time() if now is None else now) - max(b[0] for b in beats)
    if idle <= limit:
        return None
    return (
        f"hung: no forward or optimizer step on any rank for {idle:.0f} s (limit {limit:.0f} s) after "
        f"{max(b[1] for b in beats)} optimizer steps"
    )
