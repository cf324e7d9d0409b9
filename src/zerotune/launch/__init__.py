"""Starting a trial's processes: on this node, over the hosts of a hostfile, or as job steps of a
Slurm allocation."""

from ._base import Launcher, ProgramLauncher, TrialJob, TrialPool
from ._cluster import Cluster, ClusterSettings, check_counts
from ._deepspeed_runner import runner_accepts
from ._hardware import Node, detect_node, host_memory
from ._hosts import Host, read_hostfile, select_hosts
from ._leftovers import Leftover, end_leftovers, leftovers, leftovers_line, remove_dead_buffers
from ._local import LocalLauncher
from ._multinode import MultiNodeLauncher
from ._process import CPU_MALLOC, FIGURE_ENV, ProcessGroup, launcher_argv, trial_env
from ._shared_storage import check_shared
from ._slots import Slot, plan_slots
from ._slurm import RANKS_ENV, Allocation, SlurmLauncher

__all__ = [
    "RANKS_ENV",
    "Allocation",
    "SlurmLauncher",
    "check_shared",
    "CPU_MALLOC",
    "Cluster",
    "ClusterSettings",
    "FIGURE_ENV",
    "Host",
    "Launcher",
    "Leftover",
    "LocalLauncher",
    "MultiNodeLauncher",
    "Node",
    "ProcessGroup",
    "ProgramLauncher",
    "Slot",
    "TrialJob",
    "TrialPool",
    "check_counts",
    "detect_node",
    "end_leftovers",
    "host_memory",
    "launcher_argv",
    "leftovers",
    "leftovers_line",
    "plan_slots",
    "read_hostfile",
    "remove_dead_buffers",
    "runner_accepts",
    "select_hosts",
    "trial_env",
]
