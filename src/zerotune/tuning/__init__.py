"""The tuning: the Autotuner assembles a trial factory, a launcher, searchers and a record,
runs the phases, confirms the choice and writes the outputs."""

from ._outputs import summary_text, write_optimal_config
from ._settings import GROUPS, SearchSettings, settings_of
from ._trial_factory import TrialFactory
from ._tuner import Autotuner

__all__ = [
    "GROUPS",
    "SearchSettings",
    "settings_of",
    "Autotuner",
    "TrialFactory",
    "summary_text",
    "write_optimal_config",
]
