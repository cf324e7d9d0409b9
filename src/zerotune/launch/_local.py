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
import time
from pathlib import Path

from .._proc import die_with_parent
from ..store import write_json
from ..trial import TrialResult
from ._base import Launcher, TrialJob
from ._collect import collect


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


def launcher_argv(num_gpus: int, port: int) -> list[str]:
    """DeepSpeed's per-node launcher starting ``zerotune.probe`` on ``num_gpus`` local ranks.
    The user's arguments are not here: the probe reads them from the trial folder."""
    world = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_gpus))}).encode()).decode()
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
            "--master_addr=127.0.0.1", f"--master_port={port}", "--no_local_rank", "--module", "zerotune.probe"]


class ProcessGroup:
    """A child started in its own session, so that it and everything it starts can be ended
    together with one killpg."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log: Path | None, cwd: str | None = None):
        """``log`` None: the child writes to this process's stdout and stderr."""
        self._log = open(log, "ab") if log is not None else None
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT if log else None,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd,
                                     preexec_fn=die_with_parent)

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


class LocalLauncher(Launcher):
    """One trial at a time on this node."""

    def __init__(self, *, device: str):
        self.device = device
        self._running: ProcessGroup | None = None

    def run(self, job: TrialJob) -> TrialResult:
        d = job.trial_dir.resolve()
        for stale in d.glob("rank*.*"):
            stale.unlink()
        probe = {"mode": "measure", "script": job.script, "args": job.script_args,
                 "local_rank_arg": job.local_rank_arg, "out_dir": str(d), "budget": job.budget,
                 "warmup_steps": job.warmup_steps, "min_steps": job.min_steps, "max_steps": job.max_steps,
                 "max_seconds": job.max_seconds, "rel_ci": job.rel_ci, "to_beat": job.to_beat,
                 "lightning_config": str(d / "ds_config.json") if job.lightning else None,
                 "expect": {"stage": job.spec.stage, "micro_batch": job.spec.micro_batch,
                            "grad_accum": job.spec.grad_accum}}
        write_json(d / "probe.json", probe)
        env = trial_env(job.num_gpus, self.device, {**job.env, "ZEROTUNE_PROBE": str(d / "probe.json")})
        port = free_port()
        argv = launcher_argv(job.num_gpus, port)
        ranks_see = [job.script] + (["--local_rank=<rank>"] if job.local_rank_arg else []) + job.script_args
        (d / "cmd.txt").write_text(
            "# started as (the user's arguments are read from probe.json, never parsed by the launcher):\n"
            + " ".join(shlex.quote(w) for w in [f"ZEROTUNE_PROBE={d / 'probe.json'}", *argv]) + "\n"
            + "# each rank runs:\n" + " ".join(shlex.quote(w) for w in ranks_see) + "\n")
        start = time.monotonic()
        group = self._running = ProcessGroup(argv, env=env, log=d / "launcher.log")
        timed_out = False
        try:
            while group.proc.poll() is None:
                if time.monotonic() - start > job.timeout:
                    timed_out = True
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
            self._running = None
            remove_shm_buffers(port)
        return collect(spec=job.spec, trial_dir=d, world=job.num_gpus, returncode=group.proc.returncode,
                       timed_out=timed_out, timeout=job.timeout, wall_time=time.monotonic() - start,
                       budget=job.budget, min_steps=job.min_steps, rel_ci=job.rel_ci)

    @staticmethod
    def _all_ranks_done(d: Path, world: int) -> bool:
        return all((d / f"rank{r}.json").exists() for r in range(world))

    def close(self) -> None:
        if self._running is not None:
            self._running.kill(grace=2.0)
            self._running = None
