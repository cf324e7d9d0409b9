"""Model-based search (``tuner_type: model_based``): Optuna's TPE over the space, seeded.

Ordered dimensions (micro-batch, bucket sizes, thresholds) are given to TPE as the index of the
value, so it can learn that "larger is better up to a point"; booleans and strings stay
categorical. Out-of-memory is a constraint, not a bad score: TPE learns where the feasible region
ends. Points the memory model predicts not to fit are pruned before a launch and told to TPE as
infeasible, so the model learns from them too. The first point is the prior guess: the largest
micro-batch, with DeepSpeed's default knob values where the space has them.
"""

from __future__ import annotations

import random
from typing import Any

from ..request import MICRO_BATCH, Space, effective_value
from ..trials import MAXIMIZE, TrialResult, TrialSpec, TrialState
from ._space import SpaceSearch

STARTUP_TRIALS = 3
"""Random points before TPE models the rest (Optuna's default, 10, is a whole budget here)."""
MAX_REPEATS = 30
"""TPE proposals of already-seen points in a row before the next unseen point is taken at random."""


def _ordered(values: tuple) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class ModelBasedSearch(SpaceSearch):
    def __init__(
        self, space: Space, *, seed: int = 0, prior: dict[str, Any] | None = None, use_prior: bool = True, **kw
    ):
        """``prior``: values of the first point to try (default: the largest micro-batch and
        DeepSpeed's defaults); ``use_prior`` False: TPE from random start-up points alone."""
        import optuna
        from optuna.distributions import CategoricalDistribution, IntDistribution

        super().__init__(space, **kw)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._choices = {d.key: (sorted(d.values) if _ordered(d.values) else list(d.values)) for d in space.dims}
        self._dists = {
            k: IntDistribution(0, len(v) - 1) if _ordered(tuple(v)) else CategoricalDistribution(v)
            for k, v in self._choices.items()
        }
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS, multivariate=True)
        self.study = optuna.create_study(direction="maximize" if MAXIMIZE[self.metric] else "minimize", sampler=sampler)
        self._rng = random.Random(seed)
        self._trials: dict[str, Any] = {}
        """Point name -> the Optuna trial asked for it and not yet told."""
        if use_prior:
            self.study.enqueue_trial(self._encode(self._prior(prior or {})))

    # -- encoding ------------------------------------------------------------------------------
    def _prior(self, given: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, choices in self._choices.items():
            if key in given and given[key] in choices:
                out[key] = given[key]
            elif key == MICRO_BATCH:
                out[key] = max(choices)
            else:
                out[key] = effective_value({}, key, self.space.stage)
                if out[key] not in choices:
                    out[key] = choices[len(choices) // 2]
        return out

    def _encode(self, values: dict[str, Any]) -> dict[str, Any]:
        return {k: self._choices[k].index(v) if _ordered(tuple(self._choices[k])) else v for k, v in values.items()}

    def _decode(self, params: dict[str, Any]) -> dict[str, Any]:
        return {k: self._choices[k][v] if _ordered(tuple(self._choices[k])) else v for k, v in params.items()}

    # -- SpaceSearch ---------------------------------------------------------------------------
    def _next(self) -> TrialSpec | None:
        if len(self.seen) >= self.space.size:
            return None
        for _ in range(MAX_REPEATS):
            trial = self.study.ask(self._dists)
            spec = self.space.point(self._decode(trial.params))
            if spec.name not in self.seen:
                self._trials[spec.name] = trial
                return spec
            self.study.tell(trial, state=self._optuna.trial.TrialState.PRUNED)  # a repeat teaches nothing
        unseen = [p for p in self.space if p.name not in self.seen]
        if not unseen:
            return None
        return self._rng.choice(unseen)  # told to TPE as a finished trial once measured

    def _learn(self, result: TrialResult) -> None:
        trial = self._trials.pop(result.spec.name, None)
        if trial is None:  # measured by an earlier phase, or picked at random: add it as a finished trial
            self._add(result)
            return
        value, overflow = self._score(result)
        if value is None:
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            return
        trial.set_constraint("memory", overflow)
        self.study.tell(trial, value)

    def _score(self, result: TrialResult) -> tuple[float | None, float]:
        """(value, constraint): the metric and -1 for a fitting trial; for one that does not fit
        (oom, or pruned as predicted not to) the worst value and +1; (None, 0) for a crash,
        which TPE then ignores."""
        if result.state is TrialState.OK and result.metric(self.metric) is not None:
            return float(result.metric(self.metric)), -1.0
        if result.state in (TrialState.OOM, TrialState.PRUNED, TrialState.TIMEOUT):
            return (0.0 if MAXIMIZE[self.metric] else 1e12), 1.0
        return None, 0.0

    def _add(self, result: TrialResult) -> None:
        value, overflow = self._score(result)
        if value is None:
            return
        values = self.space.values_of(result.spec)
        if any(v not in self._choices[k] for k, v in values.items()):
            return
        self.study.add_trial(
            self._optuna.trial.create_trial(
                params=self._encode(values), distributions=self._dists, value=value, constraints={"memory": overflow}
            )
        )
