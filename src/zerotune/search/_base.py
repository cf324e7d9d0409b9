"""The searcher interface: what to try next, and what was learned."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from ..trials import TrialResult, TrialSpec


@dataclass(frozen=True)
class Suggestion:
    spec: TrialSpec
    prune_reason: str = ""
    """Non-empty: record the trial as pruned with this reason instead of launching it."""


class Searcher(abc.ABC):
    """Proposes trials one at a time and learns from each result (Optuna's sampler shape).
    A searcher must be deterministic given the same results, so that a rerun that replays
    stored results asks for the same trials: that is how resume works."""

    @abc.abstractmethod
    def suggest(self) -> Suggestion | None:
        """The next trial, or None when the search is over."""

    @abc.abstractmethod
    def observe(self, result: TrialResult) -> None:
        """The result of a suggested trial."""

    def ask(self, outstanding: int) -> Suggestion | None:
        """A trial to start now while ``outstanding`` suggested ones still run (concurrent
        slots); None: nothing now. By default one at a time: searchers that can propose before
        earlier results return override this."""
        return self.suggest() if outstanding == 0 else None

    notes: list[str]
