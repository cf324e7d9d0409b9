"""Running one phase of the search: ask the searcher, launch trials in the free slots, observe.

With one slot (the default on CPU, or one trial's worth of GPUs) this is the plain loop: ask,
run, observe. With more, a searcher that can propose before earlier results return (grid,
random, model-based) keeps every slot busy; the micro-batch search asks one at a time.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from .ranking import choose_best
from .search import EarlyStopping, Searcher, Suggestion
from .space import trial_config
from .store import ResultStore
from .trial import TrialResult, TrialState

if TYPE_CHECKING:
    from .launch import Slot, TrialJob
    from .tuner import Autotuner


class PhaseRun:
    def __init__(self, tuner: "Autotuner", store: ResultStore, trials: list[TrialResult], start: float):
        self.tuner, self.store, self.trials, self.start = tuner, store, trials, start
        self.limit_hit = False

    def run(self, searcher: Searcher, stopper: EarlyStopping | None) -> bool:
        """Runs ``searcher`` to its end; False when a limit (trials, time) stopped the tuning."""
        slots: list[Slot] = list(self.tuner.slots)
        running: dict[Future, tuple[Suggestion, TrialJob, Slot, int]] = {}
        stopped = False
        pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="zerotune-trial")
        try:
            while True:
                while slots and not self.limit_hit and not stopped:
                    suggestion = searcher.ask(len(running))
                    if suggestion is None:
                        break
                    prepared = self._prepare(suggestion)
                    if isinstance(prepared, TrialResult):
                        stopped = self._record(searcher, stopper, prepared)
                        continue
                    if prepared is None:
                        self.limit_hit = True
                        break
                    slot = slots.pop(0)
                    prepared.slot = slot
                    index = len(self.trials) + len(running)
                    self.tuner._emit("started", index, suggestion.spec)
                    running[pool.submit(self.tuner.launcher.run, prepared)] = (suggestion, prepared, slot, index)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: running[f][3]):
                    suggestion, job, slot, index = running.pop(future)
                    slots.append(slot)
                    result = future.result()
                    self.store.save(result, job.key)
                    self.tuner._emit("finished", index, suggestion.spec, result)
                    stopped = self._record(searcher, stopper, result) or stopped
        except BaseException:
            self.tuner.launcher.close()  # end the running trials, so their threads return
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if searcher is not self.tuner.searcher:
            self.tuner.notes += list(getattr(searcher, "notes", []))
        return not self.limit_hit

    def _record(self, searcher: Searcher, stopper: EarlyStopping | None, result: TrialResult) -> bool:
        """Tell the searcher; True when the stopping rule ends the phase."""
        self.trials.append(result)
        searcher.observe(result)
        choice = choose_best(self.trials, self.tuner.request.autotuning.metric)
        if choice and choice.best.name != self.tuner._best_name:
            self.tuner._best_name = choice.best.name
            self.tuner._emit("best", len(self.trials), choice.best.spec, choice.best)
        if stopper is not None and stopper.observe(result):
            self.tuner._note(stopper.reason)
            return True
        return False

    def _prepare(self, suggestion: Suggestion) -> TrialResult | TrialJob | None:
        """A pruned or stored result, a job to launch, or None: a limit (tuner_num_trials,
        time budget) stops the search before this trial."""
        tuner, spec, index = self.tuner, suggestion.spec, len(self.trials)
        at = tuner.request.autotuning
        if suggestion.prune_reason:
            result = TrialResult(spec=spec, state=TrialState.PRUNED, reason=suggestion.prune_reason,
                                 budget=tuner.budget)
            self.store.save(result, "pruned")
            tuner._emit("pruned", index, spec, result, suggestion.prune_reason)
            return result
        cfg = trial_config(tuner.request.base_config, spec, tuner.dp, script_sets_batch=bool(tuner._mapped(spec)))
        key = tuner._key(cfg)
        if (result := self.store.load(spec.name, key)) is not None:
            tuner._emit("reused", index, spec, result)
            return result
        if tuner._launched >= at.tuner_num_trials:
            tuner._note(f"stopped after tuner_num_trials={at.tuner_num_trials} trials")
            return None
        if tuner.time_budget and time.monotonic() - self.start > tuner.time_budget:
            tuner._note(f"stopped at the time budget of {tuner.time_budget:.0f} s")
            return None
        job = tuner._job(self.store, spec, cfg)
        job.key = key
        best = choose_best(self.trials, at.metric)
        if best is not None and at.metric in ("throughput", "latency"):
            job.to_beat = {"metric": at.metric, "value": best.best.metric(at.metric)}
        tuner._launched += 1
        return job
