"""When to stop a search (Ray Tune's scheduler role, apart from what to try)."""

from __future__ import annotations

from ..trials import TrialResult, TrialState, better, within_noise


class EarlyStopping:
    """``tuner_early_stopping``: stop after ``patience`` launched trials in a row without an
    improvement larger than the noise (a better result within the 95% interval of the best is
    no improvement). ``best``: the best result before this search began, if any."""

    def __init__(self, patience: int, metric: str, best: TrialResult | None = None):
        self.patience, self.metric, self.best = patience, metric, best
        self.since = 0

    def observe(self, result: TrialResult) -> bool:
        """Record a trial; True when the search should stop."""
        if result.state is TrialState.PRUNED:
            return False  # never launched: costs nothing, proves nothing
        value = result.metric(self.metric) if result.state is TrialState.OK else None
        if value is not None and (self.best is None or better(self.metric, value, self.best.metric(self.metric))):
            improved = self.best is None or not within_noise(self.metric, result, self.best)
            self.best = result
            if improved:
                self.since = 0
                return False
        self.since += 1
        return self.since >= self.patience

    @property
    def reason(self) -> str:
        return (
            f"stopped after {self.patience} trials without an improvement beyond noise "
            f"(tuner_early_stopping={self.patience})"
        )
