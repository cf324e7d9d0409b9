"""zerotune: find the fastest DeepSpeed configuration for a model on given hardware, then train.

``import zerotune`` is cheap: torch, DeepSpeed and Lightning load only when a tuning runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, LaunchError, NoFeasibleConfigError, ZerotuneError

if TYPE_CHECKING:
    from .record import TuningEvent
    from .result import TuningResult, load_results
    from .trial import TrialResult, TrialSpec, TrialState
    from .tuner import Autotuner

__all__ = [
    "Autotuner",
    "ConfigError",
    "LaunchError",
    "NoFeasibleConfigError",
    "TrialResult",
    "TrialSpec",
    "TrialState",
    "TuningEvent",
    "TuningResult",
    "ZerotuneError",
    "load_results",
]
__version__ = "0.1.0"

_LAZY = {
    "Autotuner": "tuner",
    "TuningEvent": "record",
    "TuningResult": "result",
    "load_results": "result",
    "TrialResult": "trial",
    "TrialSpec": "trial",
    "TrialState": "trial",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'zerotune' has no attribute {name!r}")
