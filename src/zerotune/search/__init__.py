"""Searchers behind one small interface: ``suggest()`` and ``observe(result)``."""
from ._base import Searcher, Suggestion
from ._microbatch import MicroBatchSearch

__all__ = ["MicroBatchSearch", "Searcher", "Suggestion"]
