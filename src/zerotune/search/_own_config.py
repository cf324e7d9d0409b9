"""The user's own configuration, measured before any search: the figure the choice is compared
with (its speed-up and when it pays the tuning back), and a measured point the search starts
from. Its failure (out of memory, a crash) ends nothing: the search goes on, and a note says so."""

from __future__ import annotations

from ..trials import TrialResult, TrialSpec, TrialState
from ._base import Searcher, Suggestion


class OwnConfigSearch(Searcher):
    """One trial: ``spec``, the configuration the user's ds_config trains with as it stands."""

    def __init__(self, spec: TrialSpec):
        self.spec, self.asked = spec, False
        self.notes: list[str] = []

    def suggest(self) -> Suggestion | None:
        if self.asked:
            return None
        self.asked = True
        return Suggestion(self.spec)

    def observe(self, result: TrialResult) -> None:
        if result.state is not TrialState.OK:
            why = f": {result.reason}" if result.reason else ""
            self.notes.append(
                f"your config ({result.name}) ended {result.state.value}{why}; the search goes on, and "
                "the choice is not compared with it"
            )
