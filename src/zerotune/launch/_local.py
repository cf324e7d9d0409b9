"""Trials on this node through DeepSpeed's own per-node launcher: no ssh, no pdsh, no hostfile."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from ..store import write_atomic
from ..trial import TrialResult, TrialState
from ._base import TrialJob
from ._collect import port_in_use
from ._process import ProcessGroup, free_port, launcher_argv, remove_shm_buffers, trial_env
from ._slots import visible_gpus
from ._supervise import SupervisingLauncher, clear_rank_files

PORT_ATTEMPTS = 3


class LocalLauncher(SupervisingLauncher):
    """Trials on this node, each in its slot (the tuner runs one per slot at a time)."""

    def run(self, job: TrialJob) -> TrialResult:
        extra = {}
        if job.slot is not None and job.slot.pinned:  # a share of the cores: one thread per core each
            extra["OMP_NUM_THREADS"] = job.env.get("OMP_NUM_THREADS",
                                                   str(max(1, len(job.slot.devices) // job.num_gpus)))
        d, env = self.prepare(job, extra)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            result = self.attempt(job, d, env, free_port())
            if attempt == PORT_ATTEMPTS or result.state is not TrialState.CRASHED or not port_in_use(d, job.num_gpus):
                return result
            # Another process took the port between our check and the rendezvous: a fresh port,
            # not a failed configuration.
            os.replace(d / "launcher.log", d / f"launcher.attempt{attempt}.log")
            write_atomic(d / "launcher.log", f"zerotune: the master port was in use (launcher.attempt{attempt}.log); "
                                            f"retrying on another port, attempt {attempt + 1}\n")
            clear_rank_files(d)
        raise AssertionError("unreachable")

    def start(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> list[ProcessGroup]:
        slot = job.slot
        gpus = list(slot.devices) if slot is not None and self.device == "cuda" else (
            visible_gpus(job.num_gpus) if self.device == "cuda" else None)
        argv = launcher_argv(job.num_gpus, port, gpus)
        ranks_see = [job.script] + (["--local_rank=<rank>"] if job.local_rank_arg else []) + job.script_args
        write_atomic(
            d / "cmd.txt",
            "# started as (the user's arguments are read from probe.json, never parsed by the launcher):\n"
            + " ".join(shlex.quote(w) for w in [f"ZEROTUNE_PROBE={d / 'probe.json'}", *argv]) + "\n"
            + "# each rank runs:\n" + " ".join(shlex.quote(w) for w in ranks_see) + "\n")
        return [ProcessGroup(argv, env=env, log=d / "launcher.log",
                             cores=slot.devices if slot is not None and slot.pinned else None)]

    def release(self, port: int) -> None:
        remove_shm_buffers(port)

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
