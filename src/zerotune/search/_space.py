"""Searchers over a :class:`~zerotune.request.Space`: grid and random here, model-based in
``_model_based``. They share what is not about choosing: skipping points already measured,
asking the caller's ``check`` (invalid combinations, memory predictions) before a launch, and
recording what was learned."""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Iterator

from ..request import Space
from ..trials import TrialResult, TrialSpec
from ._base import Searcher, Suggestion

Check = Callable[[TrialSpec], "str | None"]
"""Why a configuration must not be launched (invalid, predicted not to fit), or None."""


class SpaceSearch(Searcher):
    """Proposes points of ``space`` one at a time. ``known``: results measured before (by an
    earlier phase) under the point's name, used instead of a trial."""

    def __init__(
        self, space: Space, *, metric: str, check: Check | None = None, known: dict[str, TrialResult] | None = None
    ):
        self.space, self.metric = space, metric
        self.check = check or (lambda spec: None)
        self.known = dict(known or {})
        self.seen: set[str] = set()
        self.results: list[TrialResult] = []
        self.notes: list[str] = []
        self._pending: dict[str, Suggestion] = {}

    @abc.abstractmethod
    def _next(self) -> TrialSpec | None:
        """The next point to consider (it may turn out to be seen, known or pruned); None: done."""

    def _learn(self, result: TrialResult) -> None:
        """A result for a point this searcher proposed (pruned ones included)."""

    def ask(self, outstanding: int) -> Suggestion | None:
        """A new point to run alongside the ones still pending (every searcher here can)."""
        while True:
            spec = self._next()
            if spec is None:
                return None
            if spec.name in self.seen:
                continue
            self.seen.add(spec.name)
            if spec.name in self.known:  # measured already: learn from it, launch nothing
                self._learn(self.known[spec.name])
                continue
            suggestion = self._pending[spec.name] = Suggestion(spec, self.check(spec) or "")
            return suggestion

    def suggest(self) -> Suggestion | None:
        if self._pending:
            return next(iter(self._pending.values()))
        return self.ask(0)

    def observe(self, result: TrialResult) -> None:
        assert self._pending.pop(result.spec.name, None) is not None, "observe a suggested trial"
        self.results.append(result)
        self._learn(result)


class GridSearch(SpaceSearch):
    """Every point in the space's fixed order (``seed`` is accepted and unused)."""

    def __init__(self, space: Space, *, seed: int = 0, **kw):
        super().__init__(space, **kw)
        self._order: Iterator[TrialSpec] = iter(space)

    def _next(self) -> TrialSpec | None:
        return next(self._order, None)


class RandomSearch(SpaceSearch):
    """Every point once, in a seeded random order (reproducible, so a rerun resumes)."""

    def __init__(self, space: Space, *, seed: int = 0, **kw):
        super().__init__(space, **kw)
        points = list(space)
        random.Random(seed).shuffle(points)
        self._order = iter(points)

    def _next(self) -> TrialSpec | None:
        return next(self._order, None)
