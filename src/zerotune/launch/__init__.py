"""Starting a trial's processes: on this node, or over the hosts of a hostfile."""

from ._base import Launcher, ProgramLauncher, TrialJob
from ._hosts import Host, read_hostfile, select_hosts
from ._leftovers import Leftover, end_leftovers, leftovers, leftovers_line, remove_dead_buffers
from ._local import LocalLauncher
from ._multinode import MultiNodeLauncher
from ._process import CPU_MALLOC, FIGURE_ENV, ProcessGroup, launcher_argv, trial_env
from ._slots import Slot, plan_slots

__all__ = [
    "CPU_MALLOC",
    "FIGURE_ENV",
    "Host",
    "Launcher",
    "Leftover",
    "LocalLauncher",
    "MultiNodeLauncher",
    "ProgramLauncher",
    "ProcessGroup",
    "Slot",
    "TrialJob",
    "end_leftovers",
    "launcher_argv",
    "leftovers",
    "leftovers_line",
    "plan_slots",
    "read_hostfile",
    "remove_dead_buffers",
    "select_hosts",
    "trial_env",
]
