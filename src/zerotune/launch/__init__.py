"""Starting a trial's processes."""
from ._base import Launcher, TrialJob
from ._local import LocalLauncher
from ._process import CPU_MALLOC, FIGURE_ENV, ProcessGroup, launcher_argv, trial_env
from ._orphans import leftovers, reap
from ._slots import Slot, plan_slots

__all__ = ["CPU_MALLOC", "FIGURE_ENV", "Launcher", "LocalLauncher", "ProcessGroup", "Slot", "TrialJob",
           "launcher_argv", "leftovers", "plan_slots", "reap", "trial_env"]
