"""Starting a trial's processes."""
from ._base import Launcher, TrialJob
from ._local import LocalLauncher, ProcessGroup, launcher_argv, trial_env

__all__ = ["Launcher", "LocalLauncher", "ProcessGroup", "TrialJob", "launcher_argv", "trial_env"]
