"""Stage and micro-batch search (``fast: true``).

Phase 1, per stage: find the largest micro-batch that fits, jumping to the boundary the memory
fit predicts instead of doubling or bisecting. Phase 2: measure smaller micro-batches of the
stages that can still win, down to ``num_tuning_micro_batch_sizes`` per stage, stopping as soon
as a smaller one is clearly slower.
"""

from __future__ import annotations

import math
from collections.abc import Generator

from ..models import MemoryModel, Z
from ..trials import FSDP_STAGES, MEASURE_DEFAULTS, TrialResult, TrialSpec, TrialState, choose_best, clearly_worse
from ..units import format_size
from ._base import Searcher, Suggestion

MAX_PHASE1_TRIALS = 6
CANNOT_WIN_MARGIN = 0.05
"""A stage whose best is this much worse than the best stage (beyond noise) gets no more trials."""

Plan = Generator[Suggestion, TrialResult, None]

TWINS = {0: 1, 1: 0}
"""Stages whose micro-batches rank alike. At a fixed global batch, stages 0 and 1 run the same
forward and backward passes and reduce gradients once, at the accumulation boundary (DeepSpeed's
stage 1 hooks no reduction into the backward pass, unlike stage 2); they differ only in the
optimizer step (stage 1 updates its partition of the states and gathers the parameters), which
a step has once whatever its micro-batch. Their step times differ by about a constant, so the
micro-batch best for one is best for the other, and the second to be compared measures only
that one, a trial saved per stage compared."""


class MicroBatchSearch(Searcher):
    def __init__(
        self,
        *,
        stages: list[int],
        candidates: list[int],
        global_batch: int | None,
        dp: int,
        grad_accum: int,
        budget: int | None,
        metric: str,
        num_micro_batches: int,
        memory: MemoryModel,
        tie_margin: float = MEASURE_DEFAULTS.tie_margin,
        prune: dict[int, str] | None = None,
        overrides: dict[int, tuple] | None = None,
        engine: str = "deepspeed",
    ):
        """``overrides``: per stage, ds_config overrides every trial of that stage carries
        (offload settings, for example). ``engine``: what the trials train with (``fsdp``: its
        stages are FSDP2's, see FSDP_STAGES). ``tie_margin``: how much speed memory headroom may cost
        where a stage's best is chosen (see choose_best)."""
        self.tie_margin, self.engine = tie_margin, engine
        assert candidates, "candidates must be validated by the caller"
        self.stages, self.candidates = stages, sorted(candidates)
        self.global_batch, self.dp, self.default_gas = global_batch, dp, grad_accum
        self.budget, self.metric, self.num_micro_batches = budget, metric, num_micro_batches
        self.memory, self.prune, self.overrides = memory, prune or {}, overrides or {}
        self.results: list[TrialResult] = []
        self.notes: list[str] = []
        # Phase 1 runs one plan per stage; with concurrent slots, stages run side by side.
        self._stage_plans: dict[int, Plan] = {}
        self._ready: dict[int, Suggestion] = {}
        """Per stage, its plan's next suggestion, not yet handed out."""
        self._issued: dict[int, Suggestion] = {}
        """Per stage, the suggestion handed out and not yet observed."""
        self._largest: dict[int, int | None] = {}
        """Per finished stage, its largest fitting micro-batch (None: none fits)."""
        self._extras: dict[TrialSpec, Suggestion] = {}
        """Smaller micro-batches started while slots would idle (see _extra), not yet observed."""
        self._compare: Plan | None = None
        self._compare_next: Suggestion | None = None
        self._compare_issued: Suggestion | None = None

    # -- Searcher ------------------------------------------------------------------------------
    def ask(self, outstanding: int) -> Suggestion | None:
        """Phase 1: the next trial of the first stage that has none running (so one slot
        searches stage by stage, several search stages side by side), and while trials run and
        a slot would idle, a smaller micro-batch of a stage (see _extra). Phase 2: one at a time.
        Side by side, the first stage searched is the lowest (the fastest where it fits) and the
        others start from the highest (the one likeliest to fit): its trial teaches the memory
        model the parameter count and the activations, which rule out the lower stages that
        cannot fit before they cost a slot."""
        for stage in self.stages if not outstanding else self.stages[::-1]:
            if stage in self._largest or stage in self._issued:
                continue
            suggestion = self._advance(stage)
            if suggestion is not None and suggestion.spec in self._extras:
                self._ready[stage] = suggestion  # running already, as an extra: its result will do
                continue
            if suggestion is not None:
                self._issued[stage] = suggestion
                return suggestion
        if self._compare is None and outstanding and (extra := self._extra()) is not None:
            self._extras[extra.spec] = extra
            return extra
        if len(self._largest) < len(self.stages) or outstanding:
            return None
        if self._compare is None:
            self._compare = self._compare_micro_batches({s: m for s, m in self._largest.items() if m is not None})
            self._compare_next = next(self._compare, None)
        if self._compare_issued is None and self._compare_next is not None:
            self._compare_issued = self._compare_next
            return self._compare_issued
        return None

    def suggest(self) -> Suggestion | None:
        issued = list(self._issued.values()) + ([self._compare_issued] if self._compare_issued else [])
        return issued[0] if issued else self.ask(0)

    def observe(self, result: TrialResult) -> None:
        self.results.append(result)
        self.memory.observe(result)
        stage = result.spec.stage
        if self._extras.pop(result.spec, None) is not None:
            return  # its figure is in self.results, for the stage's plan and the comparison
        if stage in self._issued and self._issued[stage].spec == result.spec:
            del self._issued[stage]
            self._step(stage, result)
            return
        assert self._compare_issued is not None and self._compare_issued.spec == result.spec, (
            "observe a suggested trial"
        )
        self._compare_issued = None
        try:
            self._compare_next = self._compare.send(result)
        except StopIteration:
            self._compare_next = None

    def _extra(self) -> Suggestion | None:
        """A micro-batch of a stage to start while the stages' searches wait on their trials and
        a slot would idle (several trials at once): one the search would run later, one after
        another. Where the stage ran out of memory above what it is trying, the largest untried
        micro-batch between the two; else about half the smallest it has tried or is trying (phase 2 compares smaller micro-batches, and a larger
        one that runs out of memory sends the search down too). Spread over the stages, at most
        ``num_micro_batches`` running or fitting per stage, and never one the memory model or an
        out-of-memory trial rules out."""
        running = {st: sum(spec.stage == st for spec in self._extras) for st in self.stages}
        # The fewest running first; among those, the highest stage (the likeliest to fit).
        for stage in sorted(self.stages[::-1], key=lambda st: running[st]):
            issued = self._issued.get(stage)
            top = issued.spec.micro_batch if issued is not None and not issued.prune_reason else None
            top = top if top is not None else self._largest.get(stage)
            if top is None or self._cannot_fit(stage) is not None:
                continue
            mine = [r for r in self.results if r.spec.stage == stage]
            oom = min((r.spec.micro_batch for r in mine if r.state is TrialState.OOM), default=math.inf)
            seen = {r.spec.micro_batch for r in mine} | {
                spec.micro_batch for spec in self._extras if spec.stage == stage
            }
            seen.add(top)
            if len([c for c in seen if c < oom]) >= self.num_micro_batches:
                continue
            fit = self.memory.fit(stage)
            options = [
                c
                for c in self.candidates
                if c not in seen
                and c < oom
                and self._over_floor(stage, c) is None
                and (fit is None or not self.budget or fit.upper(c) <= self.budget)
            ]
            above = [c for c in options if top < c]
            ref = min(c for c in seen if c < oom) if any(c < oom for c in seen) else top
            lower = [c for c in options if c < ref]
            if above and oom < math.inf:  # between what it tries and what ran out: the search narrows that next
                return Suggestion(self.spec(stage, max(above)))
            if lower:
                return Suggestion(self.spec(stage, min(lower, key=lambda c: abs(math.log(c) - math.log(ref / 2)))))
        return None

    def _advance(self, stage: int) -> Suggestion | None:
        """The stage's next suggestion (starting its plan if new); None when the stage is done."""
        if stage not in self._stage_plans:
            self._stage_plans[stage] = self._stage_plan(stage)
            self._step(stage, None)
        return self._ready.pop(stage, None)

    def _step(self, stage: int, result: TrialResult | None) -> None:
        plan = self._stage_plans[stage]
        try:
            self._ready[stage] = next(plan) if result is None else plan.send(result)
        except StopIteration as done:
            self._largest[stage] = done.value

    # -- plan ----------------------------------------------------------------------------------
    def spec(self, stage: int, mb: int) -> TrialSpec:
        gas = self.global_batch // (mb * self.dp) if self.global_batch else self.default_gas
        return TrialSpec(
            stage=stage, micro_batch=mb, grad_accum=gas, overrides=self.overrides.get(stage, ()), engine=self.engine
        )

    def _stage_plan(self, stage: int) -> Generator[Suggestion, TrialResult, int | None]:
        if stage in self.prune:
            yield Suggestion(self.spec(stage, self.candidates[-1]), self.prune[stage])
            return None
        if (reason := self._dominated(stage)) is not None:
            yield Suggestion(self.spec(stage, self.candidates[-1]), reason)
            self.notes.append(f"{self._label(stage)}: not run; {reason}")
            return None
        if (reason := self._cannot_fit(stage)) is not None:
            yield Suggestion(self.spec(stage, self.candidates[0]), reason)
            self.notes.append(f"{self._label(stage)}: not run; {reason} at micro-batch {self.candidates[0]}")
            return None
        return (yield from self._largest_fit(stage))

    def _ok(self, stage: int) -> list[TrialResult]:
        return [r for r in self.results if r.spec.stage == stage and r.state is TrialState.OK]

    def _dominated(self, stage: int) -> str | None:
        """Why stage 3 cannot win, or None. At the same micro-batch it does stage 2's work plus
        gathering every parameter for the forward and the backward pass, so it is faster only
        where it fits a larger micro-batch; once stage 2 fits the largest candidate, there is
        none (in the offload search stage 3 also offloads the parameters: slower still). DeepSpeed's autotuner skips a stage on the same
        ground (its largest micro-batch no larger than an earlier stage's)."""
        if stage != 3 or self._largest.get(2) != self.candidates[-1]:
            return None
        return (
            f"{self._label(2)} fits the largest micro-batch ({self.candidates[-1]}), and {self._label(3)} adds "
            "gathering the parameters to the same work, so it cannot be faster"
        )

    def _label(self, stage: int) -> str:
        """A stage in the notes' words: "stage 2", or FSDP2's "FSDP2 keep"."""
        return f"stage {stage}" if self.engine == "deepspeed" else f"FSDP2 {FSDP_STAGES[stage]}"

    def _cannot_fit(self, stage: int) -> str | None:
        """Why a stage without trials cannot fit even its smallest micro-batch, or None: its
        prediction (transferred from measured stages, or its model states alone when nothing
        ran yet) minus the uncertainty is still above the budget."""
        if not self.budget or self._ok(stage):
            return None
        mb = self.candidates[0]
        low = self.memory.lower_bound(stage, mb)
        if low is None or low <= self.budget:
            return None
        fit = self.memory.fit(stage)
        what = _predicted(fit, mb) if fit is not None else f"model states at least {format_size(low)}"
        return f"predicted {what} > budget {format_size(self.budget)}"

    def _over_floor(self, stage: int, mb: int) -> str | None:
        """Why ``mb`` cannot fit by what the stage's out-of-memory trials held (see
        MemoryModel.floor), or None."""
        if not self.budget:
            return None
        floor = self.memory.floor(stage, mb, self.overrides.get(stage, ()))
        if floor is None or floor[0] <= self.budget:
            return None
        need, at = floor
        return (
            f"needs at least {format_size(need)} > budget {format_size(self.budget)}, by "
            f"{self.spec(stage, at.micro_batch).name}, which held {format_size(at.peak)} when it ran out"
        )

    def _first_guess(self, stage: int) -> int:
        fit = self.memory.fit(stage)
        if fit is not None and self.budget:
            target = self._largest_predicted(self.candidates, fit)
            return target if target is not None else self.candidates[0]
        lo, hi = self.candidates[0], self.candidates[-1]
        return min(self.candidates, key=lambda c: abs(math.log(c) - 0.5 * (math.log(lo) + math.log(hi))))

    def _largest_predicted(self, options: list[int], fit) -> int | None:
        """The largest option whose prediction plus its uncertainty margin is within the budget."""
        fitting = [c for c in options if fit.upper(c) <= self.budget]
        return max(fitting) if fitting else None

    def _largest_fit(self, stage: int) -> Generator[Suggestion, TrialResult, int | None]:
        ok_max: int | None = None
        oom_min: int | None = None
        failed: TrialResult | None = None
        mb = self._first_guess(stage)
        for _ in range(MAX_PHASE1_TRIALS):
            result = yield Suggestion(self.spec(stage, mb))
            if result.state is TrialState.OK:
                ok_max = max(ok_max or 0, mb)
            elif result.state in (TrialState.OOM, TrialState.TIMEOUT):
                # A timeout at a larger micro-batch is treated as "too large" too: smaller ones are faster.
                oom_min = min(oom_min or mb, mb)
                failed = result
            else:
                self.notes.append(
                    f"{self._label(stage)}: {result.name} {result.state.value} ({result.reason}); "
                    "no further trials of this stage"
                )
                return ok_max
            open_range = [
                c for c in self.candidates if (ok_max is None or c > ok_max) and (oom_min is None or c < oom_min)
            ]
            if not open_range:
                break
            fit = self.memory.fit(stage)
            if ok_max is None:
                # Nothing fits yet: go well below the failure, geometrically, but never to a
                # micro-batch that what the failure held shows cannot fit.
                fitting = [c for c in open_range if self._over_floor(stage, c) is None]
                if not fitting:
                    nxt = ([c for c in open_range if c <= max(1, mb // 4)] or open_range[:1])[-1]
                    yield Suggestion(self.spec(stage, nxt), self._over_floor(stage, nxt))
                    break
                below = [c for c in fitting if c <= max(1, mb // 4)]
                mb = below[-1] if below else fitting[0]
                continue
            if fit is None or not self.budget:
                mb = open_range[-1]
                continue
            target = self._largest_predicted(open_range, fit)
            if target is None:
                # The fit says nothing larger fits: trust it rather than spend an OOM trial, and
                # record the next size up as pruned, with the prediction.
                nxt = open_range[0]
                yield Suggestion(
                    self.spec(stage, nxt), f"predicted {_predicted(fit, nxt)} > budget {format_size(self.budget)}"
                )
                break
            mb = target
        if ok_max is None and failed is not None and failed.state is TrialState.TIMEOUT:
            self.notes.append(
                f"{self._label(stage)}: no micro-batch in {self.candidates} finished in time ({failed.name}: {failed.reason})"
            )
        elif ok_max is None:
            self.notes.append(f"{self._label(stage)}: no micro-batch in {self.candidates} fits the budget")
        return ok_max

    def _compare_micro_batches(self, largest: dict[int, int]) -> Plan:
        ranked = sorted(
            largest, key=lambda s: self._stage_best(s).metric(self.metric), reverse=self.metric != "latency"
        )
        compared: set[int] = set()
        for stage in ranked:
            best_all = choose_best(self.results, self.metric, self.tie_margin)
            if best_all and clearly_worse(self.metric, self._stage_best(stage), best_all.best, CANNOT_WIN_MARGIN):
                self.notes.append(
                    f"{self._label(stage)}: skipped smaller micro-batches; its best "
                    f"{self._stage_best(stage).name} measured over {CANNOT_WIN_MARGIN:.0%} "
                    f"behind {best_all.best.name}, beyond noise"
                )
                continue
            mb = largest[stage]
            if (twin := self._twin(stage, compared, largest)) is not None:
                yield from self._follow_twin(stage, twin, mb)
                continue
            compared.add(stage)
            while len({r.spec.micro_batch for r in self._ok(stage)}) < self.num_micro_batches:
                measured = {r.spec.micro_batch for r in self.results if r.spec.stage == stage}
                smaller = [c for c in self.candidates if c < mb and c not in measured]
                if not smaller:
                    break
                mb = min(smaller, key=lambda c: abs(math.log(c) - math.log(mb / 2)))
                result = yield Suggestion(self.spec(stage, mb))
                stage_best = self._stage_best(stage)
                if result.state is not TrialState.OK or clearly_worse(self.metric, result, stage_best):
                    break  # throughput falls with the micro-batch: smaller ones won't win either

    def _twin(self, stage: int, compared: set[int], largest: dict[int, int]) -> int | None:
        """The stage whose micro-batch comparison ``stage`` can follow (see TWINS), or None: its
        twin was compared first here, on at least two micro-batches, over a range reaching
        ``stage``'s largest, with the same overrides, at a fixed global batch."""
        twin = TWINS.get(stage)
        if (
            twin is None
            or twin not in compared
            or not self.global_batch
            or self.overrides.get(twin, ()) != self.overrides.get(stage, ())
            or largest.get(twin, 0) < largest[stage]
            or len({r.spec.micro_batch for r in self._ok(twin)}) < 2
        ):
            return None
        return twin

    def _follow_twin(self, stage: int, twin: int, largest: int) -> Plan:
        """Measure ``stage`` at its twin's best micro-batch only, where that is below its largest
        and not measured yet."""
        best = self._stage_best(twin).spec.micro_batch
        measured = {r.spec.micro_batch for r in self.results if r.spec.stage == stage}
        todo = best < largest and best not in measured
        self.notes.append(
            f"{self._label(stage)}: micro-batches below {largest} follow stage {twin}'s: at a fixed global batch the two "
            "differ only at the optimizer step (stage 1 updates its partition of the optimizer states and gathers "
            f"the parameters), once per step at any micro-batch, so their micro-batches rank alike; stage {twin}'s "
            f"best is {best}" + ("; measured that one" if todo else "")
        )
        if todo:
            yield Suggestion(self.spec(stage, best))

    def _stage_best(self, stage: int) -> TrialResult:
        choice = choose_best(self._ok(stage), self.metric, self.tie_margin)
        assert choice is not None
        return choice.best


def _predicted(fit, mb: int) -> str:
    margin = Z * fit.uncertainty(mb)
    return format_size(fit.predict(mb)) + (f" ± {format_size(margin)}" if margin else "")
