"""Trials as Slurm job steps inside an allocation (``salloc`` or ``sbatch``).

Under Slurm the nodes come from the allocation and every trial is one job step over its slot's
nodes (``srun --jobid --nodelist --ntasks-per-node --exclusive``), each rank a task of the step:
Slurm starts, tracks, accounts and kills the trial's processes, and no ssh or pdsh is needed.
The ranks meet at the first node's address (Slurm's ``NodeAddr``) on a port chosen here; the probe
reads its rank from ``SLURM_PROCID`` and ``SLURM_LOCALID`` (``RANKS_ENV``). Ending a trial or the
tuner cancels its steps (``scancel JOB.STEP``), never the allocation.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError, LaunchError
from .._files import write_atomic
from ..trials import TrialResult
from ._base import ProgramLauncher, TrialJob
from ._hosts import Host
from ._leftovers import remove_shm_buffers
from ._process import ProcessGroup, free_port, trial_env
from ._shared_storage import check_shared
from ._supervise import SupervisingLauncher

RANKS_ENV = "ZEROTUNE_RANKS_FROM"
"""Set to "slurm" for ranks started as the tasks of a job step: the probe takes RANK and
LOCAL_RANK from Slurm's task ids."""
STEP_PREFIX = "zerotune-"
_COUNT = re.compile(r"^(\d+)")


def _count(value: str | None) -> int | None:
    """The leading number of a Slurm count variable ("8", "8(x2)", "gpu:8" reads as 8)."""
    if not value:
        return None
    m = _COUNT.match(value.rsplit(":", 1)[-1])
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation zerotune runs in."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: int | None = None
    """``--ntasks-per-node`` of the allocation, where it was given."""
    gpus_per_node: int | None = None

    @classmethod
    def detect(cls, environ: dict[str, str] | None = None) -> Allocation | None:
        """The allocation this process runs in (``SLURM_JOB_ID`` set), its nodes expanded by
        ``scontrol show hostnames``; None outside Slurm."""
        env = os.environ if environ is None else environ
        job = env.get("SLURM_JOB_ID")
        if not job:
            return None
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ConfigError(
                f"SLURM_JOB_ID is set ({job}) but SLURM_JOB_NODELIST is not; run zerotune inside the "
                "allocation (salloc or sbatch), or pass --no-slurm"
            )
        return cls(
            job_id=job,
            nodes=tuple(expand_nodelist(nodelist)),
            tasks_per_node=_count(env.get("SLURM_NTASKS_PER_NODE")),
            gpus_per_node=_count(env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_GPUS_PER_NODE")),
        )


def expand_nodelist(nodelist: str) -> list[str]:
    """Node names of a Slurm node list (``gpu[01-04],cpu7``), as ``scontrol`` expands them."""
    if shutil.which("scontrol") is None:
        raise LaunchError("zerotune runs inside a Slurm allocation but 'scontrol' is not installed here")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    names = out.stdout.split()
    if out.returncode or not names:
        why = " ".join(out.stderr.split())[:200] or f"exit {out.returncode}"
        raise LaunchError(f"scontrol cannot expand the allocation's node list {nodelist!r} ({why})")
    return names


def node_address(name: str) -> str:
    """Where other nodes reach ``name``: Slurm's NodeAddr for it (its name where Slurm says none)."""
    out = subprocess.run(["scontrol", "show", "node", "--oneliner", name], capture_output=True, text=True, timeout=60)
    m = re.search(r"\bNodeAddr=(\S+)", out.stdout)
    return m.group(1) if out.returncode == 0 and m else name


class SlurmLauncher(SupervisingLauncher):
    """Each trial a job step of the allocation ``job_id`` over its slot's nodes."""

    def __init__(self, job_id: str, hosts: list[Host], *, device: str, pool: list[Host] | None = None):
        """``hosts``: where the training runs (and a trial without a slot of its own); ``pool``:
        every node a trial may run on."""
        super().__init__(device=device)
        self.job_id, self.hosts, self.pool = job_id, hosts, pool or hosts
        self.dropped: dict[str, str] = {}
        self._addresses: dict[str, str] = {}
        self._steps: dict[int, tuple[str, str]] = {}
        """Per trial's master port, its step's name and master address."""

    def address(self, host: Host) -> str:
        if host.name not in self._addresses:
            self._addresses[host.name] = node_address(host.name)
        return self._addresses[host.name]

    def hosts_of(self, job: TrialJob) -> list[Host]:
        return list(job.slot.hosts) if job.slot is not None and job.slot.hosts else self.hosts

    def step_name(self, port: int) -> str:
        return f"{STEP_PREFIX}{os.getpid()}-{port}"

    # -- before any trial ----------------------------------------------------------------------
    def preflight(self) -> None:
        for tool in ("srun", "scontrol", "squeue", "scancel"):
            if shutil.which(tool) is None:
                raise LaunchError(f"trials run as Slurm job steps, which needs {tool!r}; it is not installed here")

    def check_storage(self, results_dir: Path) -> None:
        pool = [h for h in self.pool if h.name not in self.dropped]
        self.dropped.update(check_shared(results_dir, pool, self.hosts, self._marker_argv))

    def _marker_argv(self, host: Host, path: Path, token: str) -> list[str]:
        """A one-task step on ``host`` writing ``token`` to ``path`` (the shared-storage check)."""
        code = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"
        return [
            *self._srun([host], 1, f"{STEP_PREFIX}{os.getpid()}-check"),
            sys.executable,
            "-c",
            code,
            str(path),
            token,
        ]

    # -- commands ------------------------------------------------------------------------------
    def _srun(self, hosts: list[Host], num_gpus: int, name: str) -> list[str]:
        return [
            "srun",
            f"--jobid={self.job_id}",
            f"--nodes={len(hosts)}",
            f"--nodelist={','.join(h.name for h in hosts)}",
            f"--ntasks-per-node={num_gpus}",
            f"--ntasks={num_gpus * len(hosts)}",
            "--exclusive",
            "--kill-on-bad-exit=1",
            f"--job-name={name}",
            "--export=ALL",
        ]

    def _start(
        self, num_gpus: int, d: Path, env: dict[str, str], port: int, hosts: list[Host], *, logs: bool = True
    ) -> list[ProcessGroup]:
        name, master = self.step_name(port), self.address(hosts[0])
        self._steps[port] = (name, master)
        argv = [*self._srun(hosts, num_gpus, name), sys.executable, "-u", "-m", "zerotune.probe"]
        step_env = {
            **env,
            RANKS_ENV: "slurm",
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(num_gpus * len(hosts)),
            "LOCAL_WORLD_SIZE": str(num_gpus),
        }
        write_atomic(d / "cmd.txt", "# started as (the user's arguments are read from probe.json):\n" + _words(argv))
        return [ProcessGroup(argv, env=step_env, log=d / "launcher.log" if logs else None)]

    def start(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> list[ProcessGroup]:
        return self._start(job.num_gpus, d, env, port, self.hosts_of(job))

    def run(self, job: TrialJob) -> TrialResult:
        d, env = self.prepare(job)
        return self.attempt(job, d, env, free_port())

    def run_program(
        self, probe_spec: Path, num_gpus: int, extra_env: dict[str, str], program: ProgramLauncher | None = None
    ) -> int:
        assert program is None, "a program's own launcher runs on one node (its target refuses Slurm)"
        d = probe_spec.resolve().parent / "run"
        d.mkdir(exist_ok=True)
        env = trial_env(num_gpus, self.device, {**extra_env, "ZEROTUNE_PROBE": str(probe_spec.resolve())})
        port = free_port()
        (group,) = self._start(num_gpus, d, env, port, self.hosts, logs=False)
        try:
            return group.proc.wait()
        finally:
            group.kill()
            self.release(port)

    def failed_hosts(self, job: TrialJob, d: Path, groups: list[ProcessGroup], alone: list[bool]) -> dict[str, str]:
        """Nodes that srun reports in an error (a task launch that failed there, a node not
        ready, its tasks ended) while no rank started there (``rank<r>.started`` holds the node)."""
        started = {p.read_text(errors="replace").strip() for p in d.glob("rank*.started")}
        try:
            log = (d / "launcher.log").read_text(errors="replace")
        except OSError:
            return {}
        errors = [" ".join(line.split())[:200] for line in log.splitlines() if line.startswith("srun: error:")]
        failed = {}
        for host in self.hosts_of(job):
            named = [line for line in errors if re.search(rf"(?<![\w.-]){re.escape(host.name)}(?![\w.-])", line)]
            if named and host.name not in started:
                failed[host.name] = named[-1]
        return failed

    def buffer_address(self, job: TrialJob) -> str:
        return self.address(self.hosts_of(job)[0])

    def world(self, job: TrialJob) -> int:
        return job.num_gpus * len(self.hosts_of(job))

    # -- ending --------------------------------------------------------------------------------
    def release(self, port: int) -> None:
        name, master = self._steps.pop(port, ("", ""))
        if name:
            self.cancel_steps(lambda step: step == name)
            remove_shm_buffers(port, master)

    def close(self) -> None:
        super().close()
        prefix = f"{STEP_PREFIX}{os.getpid()}-"
        self.cancel_steps(lambda step: step.startswith(prefix))

    def cancel_steps(self, chosen) -> None:
        """``scancel`` the allocation's steps whose name ``chosen`` picks (never the allocation)."""
        try:
            out = subprocess.run(
                ["squeue", "--steps", "--noheader", f"--jobs={self.job_id}", "--format=%i %j"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return
        steps = [i for i, _, n in (line.partition(" ") for line in out.stdout.splitlines()) if chosen(n.strip())]
        steps = [s for s in steps if "." in s and s.split(".", 1)[0] == self.job_id]
        if steps:
            subprocess.run(["scancel", *steps], capture_output=True, timeout=60)


def _words(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv) + "\n"
