"""Starting a trial's processes."""

from ._base import Launcher, TrialJob
from ._leftovers import Leftover, end_leftovers, leftovers, leftovers_line, remove_dead_buffers
from ._local import LocalLauncher
from ._process import CPU_MALLOC, FIGURE_ENV, ProcessGroup, launcher_argv, trial_env
from ._slots import Slot, plan_slots

__all__ = [
    "CPU_MALLOC",
    "FIGURE_ENV",
    "Launcher",
    "Leftover",
    "LocalLauncher",
    "ProcessGroup",
    "Slot",
    "TrialJob",
    "end_leftovers",
    "launcher_argv",
    "leftovers",
    "leftovers_line",
    "plan_slots",
    "remove_dead_buffers",
    "trial_env",
]
