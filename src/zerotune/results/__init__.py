"""The results folder and what it holds: zerotune's ownership mark and lock, each trial's
result.json, the tuning's record (tuning.json), and the result read back from them."""

from ._confirmed import (
    Confirmation,
    combined,
    confirmed_in,
    confirmed_of,
    earlier_confirmation,
    first_in,
    remeasured_in,
    start_rounds,
)
from ._cost import TuningCost, tuning_cost
from ._folder import OUTPUTS, FolderBusyError, FolderLock, busy, claim, discard, expand
from ._own_config import OwnConfig, compare_with_own
from ._record import Identity, TuningEvent, TuningRecord, read_session
from ._result import TuningResult, load_results, no_choice_message
from ._store import RESULT, SESSION, DamagedTrial, ResultStore

__all__ = [
    "OwnConfig",
    "compare_with_own",
    "Confirmation",
    "DamagedTrial",
    "FolderBusyError",
    "FolderLock",
    "Identity",
    "OUTPUTS",
    "RESULT",
    "ResultStore",
    "SESSION",
    "TuningCost",
    "TuningEvent",
    "TuningRecord",
    "TuningResult",
    "busy",
    "claim",
    "combined",
    "confirmed_in",
    "confirmed_of",
    "discard",
    "earlier_confirmation",
    "expand",
    "first_in",
    "load_results",
    "no_choice_message",
    "read_session",
    "remeasured_in",
    "start_rounds",
    "tuning_cost",
]
