"""What local and multi-node trials share: the trial folder made ready, the processes watched
until they end, report, time out or hang, then ended and the outcome classified."""

from __future__ import annotations

import abc
import subprocess
import threading
import time
from pathlib import Path

from .. import _cpu_info as cpu_info
from .._files import write_json
from ..trials import TrialResult, TrialState
from ._base import Launcher, TrialJob
from ._collect import collect
from ._leftovers import note_port, trial_env_marks
from ._oom_kills import oom_kill_count, oom_kills_since
from ._process import ProcessGroup, stalled, trial_env

FAILED_NODE_GRACE = 2.0
"""Seconds the other nodes get once one node's processes failed: theirs wait in a collective
that never completes."""


class SupervisingLauncher(Launcher):
    """Subclasses say how a trial's process groups start (:meth:`start`); the rest is here."""

    def __init__(self, *, device: str):
        self.device = device
        self._running: set[ProcessGroup] = set()
        self._lock = threading.Lock()
        self._cpu_info: dict[Path, threading.Thread] = {}
        """Per results folder, the thread that asks DeepSpeed's question about the CPU once for
        the tuning's ranks (see zerotune._cpu_info)."""

    @abc.abstractmethod
    def start(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> list[ProcessGroup]:
        """Start the trial's processes (they read ``d/probe.json``) and write ``d/cmd.txt``."""

    buffer_addr = "127.0.0.1"
    """The rendezvous address DeepSpeed's shared-memory buffers on this host are named by."""

    def world(self, job: TrialJob) -> int:
        return job.num_gpus

    def release(self, port: int) -> None:
        """Free what the trial on ``port`` left behind (shared-memory buffers)."""

    def finished(self, job: TrialJob, d: Path, groups: list[ProcessGroup]) -> None:
        """After the processes ended, before classification (merge per-node logs, say)."""

    def prepare(self, job: TrialJob, extra_env: dict[str, str] | None = None) -> tuple[Path, dict[str, str]]:
        """The trial folder cleared of an earlier attempt's rank files, probe.json written; the env."""
        d = job.trial_dir.resolve()
        clear_rank_files(d)
        write_json(d / "probe.json", job.probe_spec(d))
        answer = (job.work_dir or d.parent).resolve() / cpu_info.FILE
        with self._lock:
            if answer not in self._cpu_info:
                self._cpu_info[answer] = cpu_info.prefetch(answer)
        env = trial_env(
            job.num_gpus,
            self.device,
            {
                **job.env,
                **(extra_env or {}),
                "ZEROTUNE_PROBE": str(d / "probe.json"),
                **trial_env_marks(job.work_dir or d.parent),
                cpu_info.ENV: str(answer),
            },
        )
        return d, env

    def buffer_address(self, job: TrialJob) -> str:
        """The address ``job``'s ranks meet at, which names DeepSpeed's shared-memory buffers."""
        return self.buffer_addr

    def attempt(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> TrialResult:
        world, m = self.world(job), job.measure
        start = time.monotonic()
        note_port(job.work_dir or d.parent, port, self.buffer_address(job))
        kills_before = oom_kill_count()
        groups = self.start(job, d, env, port)
        with self._lock:
            self._running.update(groups)
        timed_out, hung, alone = False, None, [False] * len(groups)
        try:
            while any(g.proc.poll() is None for g in groups):
                if time.monotonic() - start > m.trial_timeout:
                    timed_out = True
                    break
                if (hung := stalled(d, world, m.stall_timeout)) is not None:
                    break
                if all((d / f"rank{r}.json").exists() for r in range(world)):
                    _wait(groups, FAILED_NODE_GRACE)  # results are written: don't wait for polling loops
                    break
                if any(g.proc.poll() not in (None, 0) for g in groups):
                    _wait(groups, FAILED_NODE_GRACE)
                    break
                time.sleep(0.1)
        finally:
            alone = [g.proc.poll() is not None for g in groups]  # ended by themselves, not by the kill below
            for g in groups:
                g.kill()
            with self._lock:
                self._running.difference_update(groups)
            self.release(port)
        self.finished(job, d, groups)
        codes = [g.proc.returncode for g in groups]
        lost = {} if timed_out or hung else self.failed_hosts(job, d, groups, alone)
        result = collect(
            spec=job.spec,
            trial_dir=d,
            world=world,
            returncode=next((c for c in codes if c), codes[0]),
            timed_out=timed_out,
            timeout=m.trial_timeout,
            wall_time=time.monotonic() - start,
            budget=job.budget,
            min_steps=job.min_steps,
            rel_ci=m.precision,
            hung=hung,
            oom_kills=oom_kills_since(kills_before),
        )
        if lost and result.state is not TrialState.OK:
            with self._lock:
                self.dropped = {**self.dropped, **lost}
            result.state = TrialState.KILLED
            result.reason = "; ".join(f"host {name} failed ({why}): it leaves the pool" for name, why in lost.items())
        return result

    def failed_hosts(self, job: TrialJob, d: Path, groups: list[ProcessGroup], alone: list[bool]) -> dict[str, str]:
        """The hosts that failed in this trial, and why: a node whose processes ended by
        themselves (``alone``) or that the launcher's log names in an error, while none of its
        ranks started (no ``rank<r>.started``). Such a trial says nothing of its config and the
        host leaves the pool. None on one node."""
        return {}

    def close(self) -> None:
        with self._lock:
            running, self._running = list(self._running), set()
        for g in running:
            g.kill(grace=2.0)
        for asking in self._cpu_info.values():
            asking.join(timeout=5.0)  # nothing is written into the results folder after the tuning


def clear_rank_files(d: Path) -> None:
    for stale in d.glob("rank*.*"):
        stale.unlink()


def _wait(groups: list[ProcessGroup], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for g in groups:
        try:
            g.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
