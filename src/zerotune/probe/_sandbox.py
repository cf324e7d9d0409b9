"""What one warm trial may change in its rank process, put back before the next trial runs.

A warm process runs the user's script once per trial (``runpy``), keeping torch, DeepSpeed and
the process group. A script, and DeepSpeed for it, change process-wide state that a cold trial
never sees twice: ZeRO-3 replaces ``torch.nn.functional.linear`` for good, the probe's and
Lightning's hooks wrap class methods, scripts edit ``sys.path``, the environment, the working
folder, signal handlers, logging, and register atexit hooks. :class:`TrialSandbox` snapshots all
of that before a trial and restores it after, and clears DeepSpeed's module-level caches that
keep an engine alive (see shared/warm-trials.md for what was measured).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2))


def _patch_points() -> list[Any]:
    """Objects whose attributes scripts and libraries replace: torch's functional API and tensor
    factories, Tensor and Module methods, DeepSpeed's engine (the probe's hooks), Lightning's
    DeepSpeed strategy and Trainer (the probe's Lightning hooks) where Lightning is loaded."""
    import torch

    points: list[Any] = [
        torch,
        torch.nn.functional,
        torch.Tensor,
        torch.nn.Module,
        torch.nn.Linear,
        torch.nn.Embedding,
        torch.distributed,
    ]
    from deepspeed.runtime.engine import DeepSpeedEngine

    points.append(DeepSpeedEngine)
    if "lightning.pytorch" in sys.modules:
        from lightning.pytorch import Trainer
        from lightning.pytorch.strategies import DeepSpeedStrategy

        points += [Trainer, DeepSpeedStrategy]
    return points


def clear_deepspeed_caches() -> list[str]:
    """Empty DeepSpeed's module-level state that holds the last engine (ZeRO-3's forward module
    stack, the unbounded cache of parameters to release); returns what was cleared."""
    cleared = []
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    stack = getattr(offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list) and stack:
        stack.clear()
        cleared.append("FWD_MODULE_STACK")
    coordinator = sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator")
    cls = getattr(coordinator, "PartitionedParameterCoordinator", None)
    for name, fn in vars(cls).items() if cls is not None else ():
        if (cache := lru_cache_in(fn)) is not None:
            cache.cache_clear()
            cleared.append(name)
    return cleared


def clear_library_state() -> list[str]:
    """Empty the per-process state in which Accelerate and transformers keep a trial's DeepSpeed
    plugin and config (else the next trial's ``Accelerator()`` gets the last one's, which the
    probe's config check reports as a crash): reset the way their own test suites do. The
    distributed state (Accelerate's PartialState) is kept, as the process group is."""
    cleared = []
    state = sys.modules.get("accelerate.state")
    for name in ("AcceleratorState", "GradientState"):
        reset = getattr(getattr(state, name, None), "_reset_state", None)
        if callable(reset):
            reset()
            cleared.append(f"accelerate {name}")
    hf = sys.modules.get("transformers.integrations.deepspeed")
    if callable(unset := getattr(hf, "unset_hf_deepspeed_config", None)):
        unset()
        cleared.append("transformers HfDeepSpeedConfig")
    return cleared


def lru_cache_in(fn: Any, depth: int = 3) -> Any:
    """An ``lru_cache`` wrapper at ``fn`` or under its decorators (``__wrapped__``, or a closure
    cell: DeepSpeed's nvtx decorator keeps the function it wraps only there)."""
    if hasattr(fn, "cache_clear"):
        return fn
    if depth == 0 or not callable(fn):
        return None
    inner = [getattr(fn, "__wrapped__", None)] + [
        c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if callable(getattr(c, "cell_contents", None))
    ]
    return next((found for f in inner if f is not None and (found := lru_cache_in(f, depth - 1)) is not None), None)


class TrialSandbox:
    """Snapshot at :meth:`enter`, restore at :meth:`exit`. While inside, ``atexit.register``
    collects the script's hooks (a cold trial ends with ``os._exit``, so they never run there
    either) and ``destroy_process_group()`` of the default group is put off: the warm process
    keeps its group for the next trial."""

    def __init__(self, script: str):
        self.script_dir = Path(script).resolve().parent
        self.atexit_hooks: list[Any] = []
        self.destroyed_group = False
        self._saved: dict[str, Any] = {}

    def enter(self) -> None:
        import torch.distributed as dist

        self._saved = {
            "argv": list(sys.argv),
            "path": list(sys.path),
            "environ": dict(os.environ),
            "cwd": os.getcwd(),
            "modules": set(sys.modules),
            "signals": {s: signal.getsignal(s) for s in _SIGNALS},
            "handlers": {name: list(logging.getLogger(name).handlers) for name in ("", "DeepSpeed")},
            "root_level": logging.getLogger().level,
            "points": [(obj, dict(vars(obj))) for obj in _patch_points()],
        }
        register, destroy = atexit.register, dist.destroy_process_group

        def collect_hook(fn, *args, **kwargs):
            self.atexit_hooks.append(fn)
            return fn

        def keep_default_group(group=None, *args, **kwargs):
            if group is None or group is dist.GroupMember.WORLD:
                self.destroyed_group = True
                return None
            return destroy(group, *args, **kwargs)

        atexit.register = collect_hook
        dist.destroy_process_group = keep_default_group
        self._saved["register"] = register

    def exit(self) -> list[str]:
        """Put everything back; returns the names of patched attributes that were restored."""
        s = self._saved
        atexit.register = s["register"]
        restored = []
        for obj, before in s["points"]:
            for name, value in list(vars(obj).items()):
                if name not in before:
                    if isinstance(obj, type):  # a method added to a class; a module may gain submodules
                        try:
                            delattr(obj, name)
                            restored.append(f"{getattr(obj, '__name__', obj)}.{name}")
                        except (AttributeError, TypeError):
                            pass
                elif value is not before[name]:
                    try:
                        setattr(obj, name, before[name])
                        restored.append(f"{getattr(obj, '__name__', obj)}.{name}")
                    except (AttributeError, TypeError):
                        pass
        sys.argv[:] = s["argv"]
        sys.path[:] = s["path"]
        os.environ.clear()
        os.environ.update(s["environ"])
        os.chdir(s["cwd"])
        for sig, handler in s["signals"].items():
            if handler is not None:
                signal.signal(sig, handler)
        for name, handlers in s["handlers"].items():
            logging.getLogger(name).handlers[:] = handlers
        logging.getLogger().setLevel(s["root_level"])
        self._forget_user_modules(s["modules"])
        return restored

    def _forget_user_modules(self, before: set[str]) -> None:
        """Modules the script imported from its own folder are imported afresh by the next trial,
        as in a cold one (their module-level state would otherwise carry over)."""
        prefix = str(self.script_dir) + os.sep
        envs = tuple(str(Path(p).resolve()) + os.sep for p in {sys.prefix, sys.base_prefix})
        for name in set(sys.modules) - before:
            file = os.path.realpath(getattr(sys.modules.get(name), "__file__", None) or "/")
            if file.startswith(prefix) and not file.startswith(envs) and "site-packages" not in file:
                del sys.modules[name]
