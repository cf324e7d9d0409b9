"""Trials across nodes: through DeepSpeed's runner (pdsh, openmpi, slurm, as DeepSpeed supports
them) or through one torchrun agent per node with a static rendezvous on the first host.

Hosts that are this machine are started directly; others through ``ssh`` (torchrun) or the
runner's own transport, so ssh is needed only when more than one host is used. A missing tool or
an unreachable host is one clear error before any trial starts (``preflight``). The results folder
must be on storage every node sees: each rank writes its result there.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .._errors import LaunchError
from .._files import write_atomic
from ..trials import TrialResult
from ._base import ProgramLauncher, TrialJob
from ._hosts import Host
from ._leftovers import RESULTS_ENV, TUNER_PID, remove_shm_buffers
from ._process import FIGURE_ENV, ProcessGroup, free_port, trial_env
from ._shared_storage import check_shared
from ._supervise import SupervisingLauncher

RUNNER_TOOLS = {
    "pdsh": "pdsh",
    "openmpi": "mpirun",
    "mpich": "mpirun",
    "mvapich": "mpirun",
    "slurm": "srun",
    "impi": "mpirun",
}
"""DeepSpeed runner launchers and the program each needs on this machine."""
LAUNCHERS = ("torchrun", *RUNNER_TOOLS)
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
FORWARDED = (*FIGURE_ENV, "PYTHONPATH", "ZEROTUNE_PROBE", RESULTS_ENV, TUNER_PID)


class MultiNodeLauncher(SupervisingLauncher):
    def __init__(
        self,
        hosts: list[Host],
        *,
        device: str,
        launcher: str = "pdsh",
        master_addr: str | None = None,
        pool: list[Host] | None = None,
    ):
        """``hosts``: where the training runs (and a trial without a slot of its own); ``pool``:
        every host a trial may run on (the hosts of each slot), checked before any trial."""
        if launcher not in LAUNCHERS:
            raise LaunchError(f"--launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
        super().__init__(device=device)
        self.hosts, self.kind, self.given_master = hosts, launcher, master_addr
        self.pool = pool or hosts
        self.dropped: dict[str, str] = {}
        """Hosts of the pool that left it before any trial (see preflight), and why."""
        self._masters: dict[int, str] = {}
        """Per trial's master port, the address its ranks meet at (its shared-memory buffers')."""
        self.master_addr = self.master_of(hosts)
        self.buffer_addr = self.master_addr

    def master_of(self, hosts: list[Host]) -> str:
        """Where ``hosts``' ranks meet: the address given, else the first host (loopback if local)."""
        return self.given_master or ("127.0.0.1" if hosts[0].local else hosts[0].name)

    def hosts_of(self, job: TrialJob) -> list[Host]:
        """The hosts ``job`` runs on: its slot's group, else the training's."""
        return list(job.slot.hosts) if job.slot is not None and job.slot.hosts else self.hosts

    # -- before any trial ----------------------------------------------------------------------
    def preflight(self) -> None:
        remote = [h for h in self.pool if not h.local]
        if self.kind != "torchrun":
            tool = RUNNER_TOOLS[self.kind]
            if shutil.which(tool) is None:
                raise LaunchError(
                    f"--launcher {self.kind} needs {tool!r}, which is not installed here; install it, "
                    "or pass --launcher torchrun (needs only ssh)"
                )
            return
        if remote and shutil.which("ssh") is None:
            raise LaunchError(
                f"hosts {', '.join(h.name for h in remote)} are reached by ssh, which is not "
                "installed here; install openssh-client"
            )
        for h in remote:
            try:
                out = subprocess.run([*SSH, h.name, "true"], capture_output=True, text=True, timeout=30)
                why = "" if out.returncode == 0 else " ".join(out.stderr.split())[:200] or f"exit {out.returncode}"
            except subprocess.TimeoutExpired:
                why = "no answer within 30 s"
            if not why:
                continue
            if h in self.hosts:  # the training runs there: nothing to tune without it
                raise LaunchError(
                    f"cannot reach host {h.name!r} by ssh ({why}); set up passwordless ssh to every host in the "
                    "hostfile, or leave it out (--exclude)"
                )
            self.dropped[h.name] = f"ssh cannot reach it ({why})"

    def check_storage(self, results_dir: Path) -> None:
        remote = [h for h in self.pool if not h.local and h.name not in self.dropped]
        if remote and self.kind in ("torchrun", "pdsh") and shutil.which("ssh") is not None:
            self.dropped.update(check_shared(results_dir, remote, self.hosts, _ssh_marker))

    # -- commands ------------------------------------------------------------------------------
    def torchrun_argv(self, num_gpus: int, node_rank: int, port: int, hosts: list[Host] | None = None) -> list[str]:
        hosts = hosts or self.hosts
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(hosts)}",
            f"--nproc-per-node={num_gpus}",
            f"--node-rank={node_rank}",
            f"--master-addr={self.master_of(hosts)}",
            f"--master-port={port}",
            "-m",
            "zerotune.probe",
        ]

    def runner_argv(self, hostfile: Path, port: int, hosts: list[Host] | None = None) -> list[str]:
        hosts = hosts or self.hosts
        include = "@".join(f"{h.name}:{','.join(map(str, h.slots))}" for h in hosts)
        return [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            f"--hostfile={hostfile}",
            f"--include={include}",
            f"--launcher={self.kind}",
            f"--master_addr={self.master_of(hosts)}",
            f"--master_port={port}",
            "--no_local_rank",
            "--module",
            "zerotune.probe",
        ]

    def _start(
        self, num_gpus: int, d: Path, env: dict[str, str], port: int, hosts: list[Host], *, logs: bool = True
    ) -> list[ProcessGroup]:
        """Every node's processes on ``hosts``; ``logs`` False: their output goes to this terminal."""
        cmds: list[list[str]] = []
        groups = []
        if self.kind == "torchrun":
            for i, host in enumerate(hosts):
                argv, host_env = self.torchrun_argv(num_gpus, i, port, hosts), dict(env)
                if self.device == "cuda":
                    host_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.slots))
                if not host.local:  # the remote shell gets the variables and the folder explicitly
                    exports = [f"{k}={host_env[k]}" for k in (*FORWARDED, "CUDA_VISIBLE_DEVICES") if k in host_env]
                    argv = [
                        *SSH,
                        host.name,
                        f"cd {shlex.quote(os.getcwd())} && env "
                        + " ".join(shlex.quote(e) for e in exports)
                        + " "
                        + shlex.join(argv),
                    ]
                cmds.append(argv)
                groups.append(ProcessGroup(argv, env=host_env, log=d / f"launcher.node{i}.log" if logs else None))
        else:
            hostfile = d / "hostfile"
            hostfile.write_text("".join(f"{h.name} slots={max(h.slots) + 1}\n" for h in hosts))
            (d / ".deepspeed_env").write_text("".join(f"{k}={env[k]}\n" for k in FORWARDED if k in env))
            argv = self.runner_argv(hostfile, port, hosts)
            cmds.append(argv)
            groups.append(
                ProcessGroup(
                    argv,
                    env={**env, "DS_ENV_FILE": str(d / ".deepspeed_env")},
                    log=d / "launcher.log" if logs else None,
                )
            )
        write_atomic(
            d / "cmd.txt",
            "# started as (the user's arguments are read from probe.json):\n"
            + "".join(shlex.join(c) + "\n" for c in cmds),
        )
        return groups

    def run_program(
        self, probe_spec: Path, num_gpus: int, extra_env: dict[str, str], program: ProgramLauncher | None = None
    ) -> int:
        assert program is None, "a program's own launcher runs on one node (its target refuses several)"
        d = probe_spec.resolve().parent / "run"
        d.mkdir(exist_ok=True)
        env = trial_env(num_gpus, self.device, {**extra_env, "ZEROTUNE_PROBE": str(probe_spec.resolve())})
        port = free_port()
        groups = self._start(num_gpus, d, env, port, self.hosts, logs=False)
        try:
            codes = [g.proc.wait() for g in groups]
        finally:
            for g in groups:
                g.kill()
            remove_shm_buffers(port, self.master_addr)
        return next((c for c in codes if c), 0)

    # -- a trial -------------------------------------------------------------------------------
    def run(self, job: TrialJob) -> TrialResult:
        d, env = self.prepare(job)
        return self.attempt(job, d, env, free_port())

    def start(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> list[ProcessGroup]:
        hosts = self.hosts_of(job)
        self._masters[port] = self.master_of(hosts)
        return self._start(job.num_gpus, d, env, port, hosts)

    def buffer_address(self, job: TrialJob) -> str:
        return self.master_of(self.hosts_of(job))

    def world(self, job: TrialJob) -> int:
        return job.num_gpus * len(self.hosts_of(job))

    def release(self, port: int) -> None:
        remove_shm_buffers(port, self._masters.pop(port, self.master_addr))

    def failed_hosts(self, job: TrialJob, d: Path, groups: list[ProcessGroup], alone: list[bool]) -> dict[str, str]:
        hosts, g = self.hosts_of(job), job.num_gpus
        started = started_ranks(d)
        failed: dict[str, str] = {}
        for i, host in enumerate(hosts):
            if host.local or started & set(range(i * g, (i + 1) * g)):
                continue  # this machine is no node to lose; a node whose rank started works
            if self.kind == "torchrun":
                code = groups[i].proc.returncode
                if alone[i] and code not in (0, None):
                    log = (d / f"launcher.node{i}.log").read_text(errors="replace")
                    failed[host.name] = _failure_line(log, host.name) or f"its processes ended with exit {code}"
            elif line := _failure_line((d / "launcher.log").read_text(errors="replace"), host.name, named=True):
                failed[host.name] = line
        return failed

    def finished(self, job: TrialJob, d: Path, groups: list[ProcessGroup]) -> None:
        if self.kind == "torchrun":  # one log for collect: each node's, in turn
            codes = [g.proc.returncode for g in groups]
            write_atomic(
                d / "launcher.log",
                "".join(
                    f"== node {i} ({h.name}), exit {codes[i]} ==\n"
                    + (d / f"launcher.node{i}.log").read_text(errors="replace")
                    for i, h in enumerate(self.hosts_of(job))
                ),
            )


def _ssh_marker(host: Host, path: Path, token: str) -> list[str]:
    """``host`` writes ``token`` to ``path`` through ssh (the shared-storage check)."""
    return [*SSH, host.name, f"printf %s {token} > {shlex.quote(str(path))}"]


def started_ranks(d: Path) -> set[int]:
    """The ranks whose process started (the probe's ``rank<r>.started`` in the trial folder)."""
    return {int(p.name[4:].split(".")[0]) for p in d.glob("rank*.started") if p.name[4:].split(".")[0].isdigit()}


_SSH_FAILURE = ("ssh:", "ssh exited with exit code", "connect", "resolve", "refused", "unreachable", "timed out")


def _failure_line(log: str, host: str, *, named: bool = False) -> str:
    """The last line of ``log`` that reports a connection failure (naming ``host`` where
    ``named``: a log of several nodes), shortened; "" where there is none."""
    for line in reversed(log.splitlines()):
        low = line.lower()
        if any(w in low for w in _SSH_FAILURE) and (not named or host in line):
            return " ".join(line.split())[:200]
    return ""
