"""Trials on this node through DeepSpeed's own per-node launcher: no ssh, no pdsh, no hostfile."""
from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .._proc import die_with_parent
from ..store import write_atomic, write_json
from ..trial import TrialResult, TrialState
from ._base import Launcher, TrialJob
from ._collect import collect, port_in_use
from ._orphans import TUNER_PID
from ._slots import visible_gpus

PORT_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHM_DIR = Path("/dev/shm")


def remove_shm_buffers(port: int, addr: str = "127.0.0.1", shm_dir: Path = SHM_DIR) -> int:
    """Remove the shared-memory allreduce buffers DeepSpeed's CPU backend made for the job on
    ``addr:port``. DeepSpeed never unlinks them (about 66 MB per rank), so without this every
    trial on CPU would leave them in /dev/shm until the machine runs out of memory."""
    removed = 0
    for path in shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_*"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def trial_env(num_gpus: int, device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial's processes. On CPU: DeepSpeed's CPU accelerator and one share
    of the cores per process, so that ranks do not fight over threads."""
    env = dict(os.environ)
    if device == "cpu":
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // num_gpus)))
    env.update(extra or {})
    return env


def launcher_argv(num_gpus: int, port: int, devices: list[int] | None = None) -> list[str]:
    """DeepSpeed's per-node launcher starting ``zerotune.probe`` on ``num_gpus`` local ranks, on
    ``devices`` (machine-wide GPU ids; DeepSpeed's launcher makes them the ranks' visible devices).
    The user's arguments are not here: the probe reads them from the trial folder."""
    ids = list(devices)[:num_gpus] if devices else list(range(num_gpus))
    world = base64.urlsafe_b64encode(json.dumps({"localhost": ids}).encode()).decode()
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
            "--master_addr=127.0.0.1", f"--master_port={port}", "--no_local_rank", "--module", "zerotune.probe"]


class ProcessGroup:
    """A child started in its own session, so that it and everything it starts can be ended
    together with one killpg."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log: Path | None, cwd: str | None = None,
                 cores: tuple[int, ...] | None = None):
        """``log`` None: the child writes to this process's stdout and stderr. ``cores``: bind the
        child (and so everything it starts) to these CPU cores."""
        self._log = open(log, "ab") if log is not None else None

        def prepare() -> None:
            die_with_parent()
            if cores:
                os.sched_setaffinity(0, cores)

        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT if log else None,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd, preexec_fn=prepare)

    def kill(self, grace: float = 3.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
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
        if self._log is not None:
            self._log.close()


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
    return (f"hung: no forward or optimizer step on any rank for {idle:.0f} s (limit {limit:.0f} s) after "
            f"{max(b[1] for b in beats)} optimizer steps")


class LocalLauncher(Launcher):
    """Trials on this node, each in its slot (the tuner runs one per slot at a time)."""

    def __init__(self, *, device: str):
        self.device = device
        self._running: set[ProcessGroup] = set()
        self._lock = threading.Lock()

    def run(self, job: TrialJob) -> TrialResult:
        d = job.trial_dir.resolve()
        for stale in d.glob("rank*.*"):
            stale.unlink()
        write_json(d / "probe.json", job.probe_spec(d))
        extra = {**job.env, "ZEROTUNE_PROBE": str(d / "probe.json"), TUNER_PID: str(os.getpid())}
        if job.slot is not None and job.slot.pinned:  # a share of the cores: one thread per core each
            extra.setdefault("OMP_NUM_THREADS", str(max(1, len(job.slot.devices) // job.num_gpus)))
        env = trial_env(job.num_gpus, self.device, extra)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            result = self._attempt(job, d, env, free_port())
            if attempt == PORT_ATTEMPTS or result.state is not TrialState.CRASHED or not port_in_use(d, job.num_gpus):
                return result
            # Another process took the port between our check and the rendezvous: a fresh port,
            # not a failed configuration.
            os.replace(d / "launcher.log", d / f"launcher.attempt{attempt}.log")
            write_atomic(d / "launcher.log", f"zerotune: the master port was in use (launcher.attempt{attempt}.log); "
                                            f"retrying on another port, attempt {attempt + 1}\n")
            for stale in d.glob("rank*.*"):
                stale.unlink()
        raise AssertionError("unreachable")

    def _attempt(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> TrialResult:
        slot = job.slot
        gpus = list(slot.devices) if slot is not None and self.device == "cuda" else (
            visible_gpus(job.num_gpus) if self.device == "cuda" else None)
        argv = launcher_argv(job.num_gpus, port, gpus)
        ranks_see = [job.script] + (["--local_rank=<rank>"] if job.local_rank_arg else []) + job.script_args
        write_atomic(
            d / "cmd.txt", "# started as (the user's arguments are read from probe.json, never parsed by the launcher):\n"
            + " ".join(shlex.quote(w) for w in [f"ZEROTUNE_PROBE={d / 'probe.json'}", *argv]) + "\n"
            + "# each rank runs:\n" + " ".join(shlex.quote(w) for w in ranks_see) + "\n")
        start = time.monotonic()
        group = ProcessGroup(argv, env=env, log=d / "launcher.log",
                             cores=slot.devices if slot is not None and slot.pinned else None)
        with self._lock:
            self._running.add(group)
        timed_out, hung = False, None
        try:
            while group.proc.poll() is None:
                if time.monotonic() - start > job.timeout:
                    timed_out = True
                    break
                if (hung := stalled(d, job.num_gpus, job.stall_timeout)) is not None:
                    break
                if self._all_ranks_done(d, job.num_gpus):
                    # Results are written; don't wait for the launcher's 1 s polling loop.
                    try:
                        group.proc.wait(timeout=2.0)
                    except subprocess.TimeoutExpired:
                        pass
                    break
                time.sleep(0.1)
        finally:
            group.kill()
            with self._lock:
                self._running.discard(group)
            remove_shm_buffers(port)
        return collect(spec=job.spec, trial_dir=d, world=job.num_gpus, returncode=group.proc.returncode,
                       timed_out=timed_out, timeout=job.timeout, wall_time=time.monotonic() - start,
                       budget=job.budget, min_steps=job.min_steps, rel_ci=job.rel_ci, hung=hung)

    def run_program(self, probe_spec: Path, num_gpus: int, extra_env: dict[str, str]) -> int:
        env = trial_env(num_gpus, self.device, {**extra_env, "ZEROTUNE_PROBE": str(probe_spec.resolve())})
        port = free_port()
        gpus = visible_gpus(num_gpus) if self.device == "cuda" else None
        group = ProcessGroup(launcher_argv(num_gpus, port, gpus), env=env, log=None)
        try:
            group.proc.wait()
        finally:
            group.kill()
            remove_shm_buffers(port)
        return group.proc.returncode or 0

    @staticmethod
    def _all_ranks_done(d: Path, world: int) -> bool:
        return all((d / f"rank{r}.json").exists() for r in range(world))

    def close(self) -> None:
        with self._lock:
            running, self._running = list(self._running), set()
        for group in running:
            group.kill(grace=2.0)
