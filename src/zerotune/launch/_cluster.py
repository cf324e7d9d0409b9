"""Where trials run: hosts, processes per host, device and how multi-node processes start.

One :class:`Cluster` makes the launcher of the trials, the slots they run in, the topology part
of a trial's identity, and the final command, so that what ``cmd_optimal.txt`` and ``zerotune
run`` start is the topology the tuning measured.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError
from ..request import MAX_PROCESSES
from ._base import Launcher
from ._hosts import Host, host_groups, read_hostfile, select_hosts
from ._local import LocalLauncher
from ._multinode import MultiNodeLauncher
from ._process import FIGURE_ENV
from ._slots import Slot, plan_slots

MAX_NODES = 4096


def _allocation(settings: ClusterSettings):
    """The Slurm allocation trials run in, or None (outside one, with a hostfile, or ``slurm`` False)."""
    from ._slurm import Allocation

    if settings.slurm is False or (settings.hostfile is not None and not settings.slurm):
        return None
    if settings.hostfile is not None:
        raise ConfigError("--slurm takes the nodes from the allocation; give it or --hostfile, not both")
    found = Allocation.detect()
    if found is None and settings.slurm:
        raise ConfigError(
            "--slurm runs trials as job steps of a Slurm allocation, and SLURM_JOB_ID is not set; run "
            "zerotune inside salloc or sbatch"
        )
    return found


def check_counts(num_gpus: int | None, num_nodes: int | None) -> None:
    """Process and node counts in range (before anything is built from them)."""
    for name, value, top in (("--num-gpus", num_gpus, MAX_PROCESSES), ("--num-nodes", num_nodes, MAX_NODES)):
        if value is not None and not 1 <= value <= top:
            raise ConfigError(f"{name} {value} is out of range; give a number from 1 to {top}")


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """Where trials run and with what: the faces' options of the machines, checked once."""

    num_gpus: int | None = None
    """Processes per node (default: every GPU here, 1 on CPU; a hostfile's slots)."""
    num_nodes: int | None = None
    """Nodes (default: every host of ``hostfile``, else this one)."""
    memory_per_device: int | str | None = None
    """Memory budget per process, bytes or a size such as "16GB" (default: the device's memory on
    GPU, RAM / processes on CPU)."""
    max_concurrent_trials: int | None = None
    """Trials at once, each on its own GPUs (default: devices // num_gpus; one at a time on CPU)."""
    warm_trials: bool | None = None
    """False starts every trial in processes of its own (default: the autotuning section's
    ``warm_trials``, true: trials on one node reuse their processes)."""
    hostfile: str | Path | None = None
    """DeepSpeed's hostfile ("hostname slots=N" per line) for multi-node trials."""
    include: str = ""
    """Hosts and slots to use, in DeepSpeed's runner format (``host1:0,1@host2``)."""
    exclude: str = ""
    """Hosts and slots to leave out, in the same format."""
    multinode_launcher: str = "pdsh"
    """How DeepSpeed's runner reaches the other nodes."""
    master_addr: str | None = None
    """The address the ranks meet at (default: the first host)."""
    slurm: bool | None = None
    """Trials as job steps of the Slurm allocation zerotune runs in, over its nodes (default:
    inside an allocation, ``SLURM_JOB_ID`` set, without ``hostfile``); False: this node only."""

    def __post_init__(self) -> None:
        from .._api_check import check_values

        check_values(type(self).__name__, type(self), {f: getattr(self, f) for f in self.__dataclass_fields__})
        check_counts(self.num_gpus, self.num_nodes)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    device: str
    """"cuda" or "cpu"."""
    device_count: int
    num_gpus: int
    """Processes per node."""
    hosts: tuple[Host, ...] | None = None
    """From a hostfile, the hosts a trial (and the training) runs on; None: this node only."""
    groups: tuple[tuple[Host, ...], ...] = ()
    """From a hostfile, every disjoint group of hosts a trial can run on (the first is
    ``hosts``): concurrent multi-node trials run one per group."""
    hostfile: str | None = None
    launcher_kind: str = "pdsh"
    master_addr: str | None = None
    slurm_job: str | None = None
    """The Slurm allocation whose nodes ``hosts`` and ``groups`` are: trials run as its job steps."""

    @classmethod
    def build(cls, settings: ClusterSettings, *, device: str, device_count: int, num_gpus: int | None) -> Cluster:
        """The cluster ``settings`` ask for on this node's ``device``, with ``num_gpus`` processes
        per node (the settings' or what the target runs with). Validated before anything runs:
        counts in range, hosts that exist, the GPUs asked for here."""
        num_nodes, hostfile, include, exclude = (
            settings.num_nodes,
            settings.hostfile,
            settings.include,
            settings.exclude,
        )
        check_counts(num_gpus, num_nodes)
        hosts, groups = None, ()
        allocation = _allocation(settings)
        if allocation is not None:
            if include or exclude:
                raise ConfigError(
                    "--include and --exclude pick hosts from a --hostfile; under Slurm the nodes are the "
                    "allocation's (ask salloc or sbatch for the nodes you want)"
                )
            gpus = num_gpus or allocation.tasks_per_node or allocation.gpus_per_node
            gpus = gpus or (device_count if device == "cuda" else 1)
            listed = {name: gpus for name in allocation.nodes}
            hosts = tuple(select_hosts(listed, num_nodes=num_nodes, num_gpus=gpus))
            num_gpus = gpus
            groups = tuple(host_groups(listed, num_nodes=len(hosts), num_gpus=gpus))
        elif hostfile is not None:
            listed = read_hostfile(hostfile)
            hosts = tuple(
                select_hosts(listed, num_nodes=num_nodes, num_gpus=num_gpus, include=include, exclude=exclude)
            )
            num_gpus = len(hosts[0].slots)
            found = host_groups(listed, num_nodes=len(hosts), num_gpus=num_gpus, include=include, exclude=exclude)
            groups = (hosts, *(g for g in found if g != hosts and not set(g) & set(hosts)))
        elif include or exclude:
            raise ConfigError("--include and --exclude pick hosts from a --hostfile; give one")
        elif num_nodes not in (None, 1):
            raise ConfigError(
                f"--num-nodes {num_nodes} needs --hostfile naming the nodes, in DeepSpeed's format "
                "(one 'hostname slots=N' per line)"
            )
        num_gpus = num_gpus or (device_count if device == "cuda" else 1)
        if device == "cuda" and hosts is None and num_gpus > device_count:
            raise ConfigError(f"--num-gpus {num_gpus} is more than the {device_count} GPUs here")
        return cls(
            device=device,
            device_count=device_count,
            num_gpus=num_gpus,
            hosts=hosts,
            groups=groups,
            hostfile=str(Path(hostfile).resolve()) if hostfile is not None else None,
            launcher_kind=settings.multinode_launcher,
            master_addr=settings.master_addr,
            slurm_job=allocation.job_id if allocation is not None else None,
        )

    @property
    def num_nodes(self) -> int:
        return len(self.hosts) if self.hosts else 1

    @property
    def world(self) -> int:
        return self.num_gpus * self.num_nodes

    @property
    def multinode(self) -> bool:
        """Trials start through a multi-node launcher: several hosts, one that is not this one, or
        groups of hosts that trials run on side by side."""
        if self.slurm_job is not None:
            return True
        return self.hosts is not None and (len(self.hosts) > 1 or not self.hosts[0].local or len(self.groups) > 1)

    def make_launcher(self) -> Launcher:
        if self.slurm_job is not None:
            from ._slurm import SlurmLauncher

            pool = [h for g in self.groups for h in g]
            return SlurmLauncher(self.slurm_job, list(self.hosts), device=self.device, pool=pool)
        if self.multinode:
            return MultiNodeLauncher(
                list(self.hosts),
                device=self.device,
                launcher=self.launcher_kind,
                master_addr=self.master_addr,
                pool=[h for g in self.groups or (self.hosts,) for h in g],
            )
        return LocalLauncher(device=self.device)

    def slots(self, max_concurrent: int | None) -> list[Slot]:
        if self.multinode or (self.hosts is not None and self.device == "cuda"):
            # One trial per group of hosts at once (as many groups as --max-concurrent-trials
            # allows; every one by default, as the GPUs of one node are all used).
            groups = self.groups or (self.hosts,)
            n = max(1, min(len(groups), max_concurrent or len(groups)))
            return [Slot(i, g[0].slots, hosts=g if self.multinode else ()) for i, g in enumerate(groups[:n])]
        return plan_slots(self.device, self.device_count, self.num_gpus, max_concurrent)

    def topology(self) -> dict:
        """What a measurement depends on of where it ran: part of each trial's identity."""
        return {
            "device": self.device,
            "num_gpus": self.num_gpus,
            "num_nodes": self.num_nodes,
            # Under Slurm the nodes are whichever the allocation got, of the partition asked for:
            # a rerun in a new allocation of the same shape measures the same.
            "hosts": [[h.name, list(h.slots)] for h in self.hosts] if self.hosts and not self.slurm_job else None,
            **({"slurm": True} if self.slurm_job else {}),
        }

    def run_env(self) -> dict[str, str]:
        """What the trials' environment sets that their figures depend on: on CPU, DeepSpeed's
        CPU accelerator, the threads per process (one job ran at full speed with them and
        several times slower without) and glibc's allocator thresholds (see CPU_MALLOC)."""
        if self.device != "cpu":
            return {}
        from ._process import trial_env

        env = trial_env(self.num_gpus, self.device)
        return {k: env[k] for k in FIGURE_ENV if k in env}

    def env_words(self) -> list[str]:
        """VAR=value words the final command needs: :meth:`run_env`, as the trials ran."""
        return [f"{k}={shlex.quote(v)}" for k, v in self.run_env().items()]

    def command_line(self, script: str, args: list[str]) -> str:
        """The shell line (every word quoted) that trains ``script args`` on this cluster."""
        from ._deepspeed_runner import runner_accepts

        if self.slurm_job is not None:
            return self.slurm_lines(script, args)
        words = self.launch_words(script, args, lambda runner: runner_accepts(runner, script, args, self.device))
        return self.shell_line(self.env_words(), words)

    def slurm_lines(self, script: str, args: list[str]) -> str:
        """Inside a Slurm allocation of the tuned topology: one torchrun agent per node, started
        as one job step, meeting at the first node's address (Slurm's NodeAddr for it)."""
        agent = (
            f'exec torchrun --nnodes="$SLURM_NNODES" --nproc-per-node={self.num_gpus} --node-rank="$SLURM_NODEID" '
            '--master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" "$@"'
        )
        srun = ["srun", f"--nodes={self.num_nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        words = [*srun, "bash", "-c", agent, "torchrun", script, *args]
        return (
            f"# inside a Slurm allocation of {self.num_nodes} node(s) (salloc --nodes={self.num_nodes}), or: "
            "sbatch sbatch_optimal.sh\n"
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            "export MASTER_ADDR=$(scontrol show node --oneliner \"$head\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')\n"
            "export MASTER_PORT=29500\n" + " ".join(self.env_words() + [shlex.quote(w) for w in words])
        )

    def batch_script(self, command: str) -> str | None:
        """``command`` (cmd_optimal.txt's text) as a Slurm batch script for the tuned topology,
        run from this folder; None outside Slurm."""
        if self.slurm_job is None:
            return None
        lines = [
            "#!/bin/bash",
            "#SBATCH --job-name=zerotune-optimal",
            f"#SBATCH --nodes={self.num_nodes}",
            "#SBATCH --ntasks-per-node=1",
            *([f"#SBATCH --gpus-per-node={self.num_gpus}"] if self.device == "cuda" else []),
            f"# The configuration zerotune chose, on the topology it measured: {self.num_nodes} node(s) x "
            f"{self.num_gpus} process(es).",
            "set -euo pipefail",
            f"cd {shlex.quote(os.getcwd())}",
            *(line for line in command.splitlines() if not line.startswith("# inside a Slurm allocation")),
        ]
        return "\n".join(lines) + "\n"

    def launch_words(self, script: str, args: list[str], runner_accepts) -> list[str]:
        """The command that trains ``script args`` on this cluster, as words for a shell.
        ``runner_accepts(argv)``: whether DeepSpeed's runner hands the script's arguments through
        untouched (its argparse abbreviates); if not, torchrun."""
        if self.hosts is None or not self.multinode:
            runner = ["--num_gpus", str(self.num_gpus), script, *args]
            if runner_accepts(runner):
                return ["deepspeed", *runner]
            return ["torchrun", f"--nproc_per_node={self.num_gpus}", script, *args]
        include = "@".join(f"{h.name}:{','.join(map(str, h.slots))}" for h in self.hosts)
        master = self.master_addr or self.hosts[0].name
        if self.launcher_kind == "torchrun":
            # One agent per node: the same command with its --node-rank on each host.
            return [
                "torchrun",
                f"--nnodes={self.num_nodes}",
                f"--nproc-per-node={self.num_gpus}",
                "--node-rank=${NODE_RANK}",
                f"--master-addr={master}",
                "--master-port=29500",
                script,
                *args,
            ]
        runner = [
            f"--hostfile={self.hostfile}",
            f"--include={include}",
            f"--launcher={self.launcher_kind}",
            f"--master_addr={master}",
            script,
            *args,
        ]
        if runner_accepts(runner):
            return ["deepspeed", *runner]
        return Cluster(**{**self.__dict__, "launcher_kind": "torchrun"}).launch_words(script, args, runner_accepts)

    def shell_line(self, env: list[str], words: list[str]) -> str:
        quoted = [w if w == "--node-rank=${NODE_RANK}" else shlex.quote(w) for w in words]
        line = " ".join(env + quoted)
        if self.multinode and words[:1] == ["torchrun"]:
            hosts = " ".join(h.name for h in self.hosts)
            return f"# run on each node ({hosts}) with NODE_RANK set to its position in that list (0 first)\n" + line
        return line
