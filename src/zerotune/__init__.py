"""zerotune: find the fastest DeepSpeed configuration for a model on given hardware, then train.

``import zerotune`` is cheap: torch, DeepSpeed and Lightning load only when a tuning runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import ConfigError, LaunchError, NoFeasibleConfigError, ZerotuneError
from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .results import TuningEvent, TuningResult, load_results
    from .trials import TrialResult, TrialSpec, TrialState
    from .tuning import Autotuner

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

__getattr__ = lazy_exports(
    __name__,
    {
        "Autotuner": "tuning",
        "TuningEvent": "results",
        "TuningResult": "results",
        "load_results": "results",
        "TrialResult": "trials",
        "TrialSpec": "trials",
        "TrialState": "trials",
    },
)
