"""Searchers behind one small interface: ``suggest()`` and ``observe(result)``; stopping rules apart."""

from ._base import Searcher, Suggestion
from ._microbatch import CANNOT_WIN_MARGIN, MicroBatchSearch
from ._model_based import ModelBasedSearch
from ._own_config import OwnConfigSearch
from ._space import GridSearch, RandomSearch, SpaceSearch
from ._stopping import EarlyStopping

SEARCHERS = {"gridsearch": GridSearch, "random": RandomSearch, "model_based": ModelBasedSearch}
"""``autotuning.tuner_type`` -> the searcher over a knob space."""

__all__ = [
    "CANNOT_WIN_MARGIN",
    "SEARCHERS",
    "EarlyStopping",
    "GridSearch",
    "MicroBatchSearch",
    "ModelBasedSearch",
    "OwnConfigSearch",
    "RandomSearch",
    "Searcher",
    "SpaceSearch",
    "Suggestion",
]
