"""Running one phase of the search: ask the searcher, launch trials in the free slots, observe.

With one slot (the default on CPU, or one trial's worth of GPUs) this is the plain loop: ask,
run, observe. With more, a searcher that can propose before earlier results return (grid,
random, model-based) keeps every slot busy; the micro-batch search asks one at a time.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .._files import write_json
from ..models import Prediction, ThroughputModel
from ..search import EarlyStopping, Searcher, Suggestion
from ..trials import TO_BEAT_FILE, TrialResult, TrialState, choose_best, figure_of, fmt_metric

if TYPE_CHECKING:
    from ..launch import Launcher, Slot, TrialJob, TrialPool
    from ..results import TuningRecord
    from ._trial_factory import TrialFactory


class PhaseRun:
    """Runs the phases of one tuning, one after another, on the same trials and throughput model."""

    def __init__(
        self,
        trials: TrialFactory,
        launcher: Launcher,
        slots: list[Slot],
        record: TuningRecord,
        *,
        start: float,
        time_budget: float | None,
    ):
        """``start``: when the tuning started (the launcher's clock, Launcher.now); ``time_budget``: seconds after
        which no trial is launched (None: no limit)."""
        self.factory, self.launcher, self.slots, self.record = trials, launcher, list(slots), record
        self.start, self.time_budget = start, time_budget
        self.metric = trials.request.autotuning.metric
        self.margin = trials.measure.tie_margin
        self.max_trials = trials.request.autotuning.tuner_num_trials
        self.trials = record.trials
        self.limit_hit = False
        self.model = ThroughputModel()
        """Predicts each trial before it runs, verified against what it then measures."""
        self._predictions: dict[str, Prediction | None] = {}
        self._running_jobs: list[TrialJob] = []

    def run(self, searcher: Searcher, stopper: EarlyStopping | None) -> bool:
        """Runs ``searcher`` to its end; False when a limit (trials, time) stopped the tuning."""
        slots: list[Slot] = [s for s in self.slots if self.alive(s)]
        if not slots:
            self.record.note("no trial can run: every group of hosts lost a host (see the hosts left out of the pool)")
            return False
        running: dict[Future, tuple[Suggestion, TrialJob, Slot, int]] = {}
        again: list[tuple[Suggestion, TrialJob, int]] = []
        """Trials whose host failed under them: they run again on a group that kept its hosts."""
        stopped = False
        pool = self.launcher.trial_pool(len(slots))
        try:
            while True:
                while slots and again:
                    suggestion, job, index = again.pop(0)
                    job.slot = slot = slots.pop(0)
                    self.record.emit("started", index, suggestion.spec)
                    running[self._submit(pool, job)] = (suggestion, job, slot, index)
                while slots and not self.limit_hit and not stopped:
                    suggestion = searcher.ask(len(running))
                    if suggestion is None:
                        break
                    prepared = self._prepare(suggestion)
                    if any(t is prepared for t in self.trials):
                        searcher.observe(prepared)  # measured earlier in this tuning (the user's config)
                        continue
                    if isinstance(prepared, TrialResult):
                        stopped = self._record(searcher, stopper, prepared)
                        continue
                    if prepared is None:
                        self.limit_hit = True
                        break
                    slot = slots.pop(0)
                    prepared.slot = slot
                    index = len(self.trials) + len(running)
                    self.record.emit("started", index, suggestion.spec)
                    running[self._submit(pool, prepared)] = (suggestion, prepared, slot, index)
                if not running and not (again and slots):
                    break
                done = pool.wait_any(running)
                for future in sorted(done, key=lambda f: running[f][3]):
                    suggestion, job, slot, index = running.pop(future)
                    self._running_jobs.remove(job)
                    result = future.result()
                    if self.alive(slot):
                        slots.append(slot)
                    elif result.state is TrialState.KILLED and any(self.alive(s) for s in self.slots):
                        again.append((suggestion, job, index))  # the host failed, not the config
                        continue
                    prediction = self._predictions.pop(result.name, None)
                    result.predicted = prediction.throughput if prediction is not None else None
                    self.model.verify(result.name, prediction, result)
                    self.record.save(result, job.config)
                    self.record.ran(result)
                    self.record.emit("finished", index, suggestion.spec, result)
                    stopped = self._record(searcher, stopper, result) or stopped
        except BaseException:
            self.launcher.close()  # end the running trials, so their threads return
            raise
        finally:
            pool.shutdown()
        for note in getattr(searcher, "notes", []):
            self.record.note(note)
        return not self.limit_hit

    def _submit(self, pool: TrialPool, job: TrialJob) -> Future:
        (job.trial_dir / TO_BEAT_FILE).unlink(missing_ok=True)  # an earlier run's: not this one's leader
        self._running_jobs.append(job)
        return pool.submit(self.launcher.run, job)

    def alive(self, slot: Slot) -> bool:
        """None of ``slot``'s hosts left the pool (see Launcher.dropped)."""
        return not {h.name for h in slot.hosts} & set(self.launcher.dropped)

    def _to_beat(self) -> dict | None:
        """The best trial's figure, which a trial may stop measuring against once it clearly
        cannot beat it (TrialJob.to_beat); None without one."""
        best = choose_best(self.record.ranked, self.metric, self.margin)
        lead = figure_of(best.best, self.metric) if best is not None else None
        if lead is None or self.metric not in ("throughput", "latency") or not math.isfinite(lead.rel_se):
            return None  # a leader without an interval (one timed step) cannot show anything slower
        return {
            "metric": self.metric,
            "value": lead.value,
            "rel_se": lead.rel_se,
            "df": lead.df if math.isfinite(lead.df) else None,
        }

    def _tell_running(self) -> None:
        """Give the trials still running the best figure they did not start with (TO_BEAT_FILE in
        their folders, read by the probe at each step): with trials side by side, most start
        before any leader exists, and one that clearly cannot beat it stops early all the same."""
        target = self._to_beat()
        if target is None:
            return
        for job in self._running_jobs:
            if job.to_beat != target:
                job.to_beat = target
                write_json(job.trial_dir / TO_BEAT_FILE, target)

    def _record(self, searcher: Searcher, stopper: EarlyStopping | None, result: TrialResult) -> bool:
        """Tell the searcher; True when the stopping rule ends the phase."""
        self.record.add(result)
        self.model.observe(result)
        searcher.observe(result)
        self.record.lead(choose_best(self.record.ranked, self.metric, self.margin))
        self._tell_running()
        if stopper is not None and stopper.observe(result):
            self.record.note(stopper.reason)
            return True
        return False

    def _prepare(self, suggestion: Suggestion) -> TrialResult | TrialJob | None:
        """A pruned or stored result (one this tuning has: as it is), a job to launch, or None:
        a limit (tuner_num_trials, time budget) stops the search before this trial."""
        factory, record, spec, index = self.factory, self.record, suggestion.spec, len(self.trials)
        if suggestion.prune_reason:
            result = TrialResult(
                spec=spec, state=TrialState.PRUNED, reason=suggestion.prune_reason, budget=factory.budget
            )
            record.emit("pruned", index, spec, result, suggestion.prune_reason)
            return result
        if (earlier := next((t for t in self.trials if t.spec == spec), None)) is not None:
            return earlier
        cfg = factory.config_for(spec)
        prediction = self.model.predict(spec)
        if (result := record.lookup(spec, cfg)) is not None:
            # Verified as if it ran now, so that a rerun makes the same decisions as the first run.
            self.model.verify(spec.name, prediction, result)
            record.emit("reused", index, spec, result)
            record.reused(result)
            return result
        if record.launched >= self.max_trials:
            record.note(f"stopped after tuner_num_trials={self.max_trials} trials")
            return None
        if self.time_budget and self.launcher.now() - self.start > self.time_budget:
            record.note(f"stopped at the time budget of {self.time_budget:g} s")
            return None
        if reason := self._predicted_loser(spec, prediction):
            result = TrialResult(
                spec=spec,
                state=TrialState.PRUNED,
                reason=reason,
                budget=factory.budget,
                predicted=prediction.throughput,
            )
            record.emit("pruned", index, spec, result, reason)
            return result
        job = factory.make_job(record.store, spec, cfg)
        self._predictions[spec.name] = prediction
        job.to_beat = self._to_beat()
        record.launching()
        return job

    def _predicted_loser(self, spec, prediction: Prediction | None) -> str:
        """Why ``spec`` need not run: predicted slower than the best trial's lower bound even with
        the model's largest error so far added, and even at the fast end of the interval the
        trials it rests on give it; "" where it must run (no prediction, a model not yet verified
        on enough trials, another metric than throughput, the user's own config)."""
        metric = self.metric
        if prediction is None or not self.model.verified or metric != "throughput" or spec == self.factory.own_spec:
            return ""
        choice = choose_best(self.record.ranked, metric, self.margin)
        if choice is None:
            return ""
        best = choice.best
        error = self.model.error
        bound = best.metric(metric) - (best.metric_ci(metric) or 0.0)
        if prediction.throughput * (1 + error) >= bound or prediction.upper >= bound:
            return ""
        return (
            f"throughput model: predicted {prediction.throughput:.1f} samples/s from {prediction.basis}; "
            f"even {error:.0%} higher (the model's largest error so far), or at {prediction.upper:.1f} (the fast "
            f"end of the interval its trials' own give it), it stays below {best.name} at "
            f"{fmt_metric(metric, best)}"
        )
