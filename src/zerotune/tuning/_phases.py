"""The search after the micro-batch phase: offload where needed, then ZeRO knobs.

Each phase is a searcher (what to try) with an optional stopping rule (when to stop); the
:class:`~zerotune.Autotuner` runs them in turn and each sees every trial before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..models import MemorySetup, Z, model_states
from ..request import MICRO_BATCH, Dimension, Space, invalid_reason, stage_dimensions, trial_config
from ..search import CANNOT_WIN_MARGIN, SEARCHERS, EarlyStopping, MicroBatchSearch, Searcher
from ..trials import SHORT_KEYS, TrialResult, TrialSpec, TrialState, choose_best, clearly_worse
from ..units import format_size

if TYPE_CHECKING:
    from ..results import TuningRecord
    from ._trial_factory import TrialFactory

SEED = 0
"""Random and model-based searches are seeded, so a rerun asks for the same trials (resume)."""


def offload_searcher(factory: TrialFactory, record: TuningRecord) -> Searcher | None:
    """Offload to CPU where needed (``offload`` None: only when nothing fit without it), or
    always (True): the optimizer for stages 1-2, optimizer and parameters for stage 3."""
    trials = record.trials
    zero = factory.request.space_config.get("zero_optimization") or {}
    if factory.offload is False or zero.get("offload_optimizer") or zero.get("offload_param"):
        return None
    if factory.offload is None and (
        any(t.state is TrialState.OK for t in trials) or not any(t.state is TrialState.OOM for t in trials)
    ):
        return None
    stages = [s for s in factory.request.stages if s >= 1]
    if not stages:
        return None
    common: tuple = (("zero_optimization.offload_optimizer.device", "cpu"),)
    if "optimizer" not in factory.request.space_config:  # a client optimizer: let DeepSpeed offload it
        common += (("zero_force_ds_cpu_optimizer", False),)
    overrides = {s: common + ((("zero_optimization.offload_param.device", "cpu"),) if s == 3 else ()) for s in stages}
    record.note(
        ("nothing fit without offload: " if factory.offload is None else "")
        + f"searching stages {stages} with offload to cpu"
    )
    at = factory.request.autotuning
    return MicroBatchSearch(
        stages=stages,
        candidates=factory.candidates(),
        global_batch=factory.request.global_batch,
        dp=factory.dp,
        grad_accum=1,
        budget=factory.budget,
        metric=at.metric,
        tie_margin=factory.measure.tie_margin,
        num_micro_batches=at.num_tuning_micro_batch_sizes,
        memory=factory.memory_model(overrides),
        overrides=overrides,
    )


def fsdp_offload_searcher(factory: TrialFactory, record: TuningRecord) -> Searcher | None:
    """FSDP2 with CPU offload (parameters, gradients and optimizer states: FSDP2 offloads all or
    nothing), resharding after forward, where offload is searched: always (``offload`` True), or
    only when nothing fit without it (None)."""
    if "fsdp" not in factory.engines or factory.offload is False:
        return None
    trials = record.trials
    if factory.offload is None and (
        any(t.state is TrialState.OK for t in trials) or not any(t.state is TrialState.OOM for t in trials)
    ):
        return None
    record.note(
        ("nothing fit without offload: " if factory.offload is None else "") + "searching FSDP2 with CPU offload"
    )
    return factory.micro_batch_search("fsdp", overrides={3: (("fsdp.offload", True),)})


def knob_searchers(factory: TrialFactory, record: TuningRecord) -> Iterator[tuple[Searcher, EarlyStopping]]:
    """Per stage that can still win, a search of its knobs around its best micro-batch
    (``fast: false``: DeepSpeed's default knobs plus the user's lists; ``fast: true``: the
    user's lists only), best stage first."""
    at, trials = factory.request.autotuning, record.trials
    hidden = at.model_info.hidden_size if at.model_info else None
    groups: dict[tuple, list[TrialResult]] = {}
    for t in trials:
        if t.state is TrialState.OK and not _knobbed(t.spec) and t.spec.engine == "deepspeed":
            groups.setdefault((t.spec.stage, t.spec.overrides), []).append(t)
    margin = factory.measure.tie_margin
    bests = {key: choose_best(results, at.metric, margin).best for key, results in groups.items()}
    for key in sorted(bests, key=lambda k: bests[k].metric(at.metric), reverse=at.metric != "latency"):
        stage, fixed = key
        dims = stage_dimensions(stage, factory.request.space_config, defaults=not at.fast, hidden_size=hidden)
        if not dims:
            continue
        overall = choose_best(record.ranked, at.metric, margin)
        if clearly_worse(at.metric, bests[key], overall.best, CANNOT_WIN_MARGIN):
            record.note(
                f"stage {stage}: knobs not searched; its best {bests[key].name} measured over "
                f"{CANNOT_WIN_MARGIN:.0%} behind {overall.best.name}, beyond noise"
            )
            continue
        space = Space(
            stage=stage,
            dims=(*dims, Dimension(MICRO_BATCH, _around(factory, bests[key].spec.micro_batch))),
            global_batch=factory.request.global_batch,
            dp=factory.dp,
            default_gas=bests[key].spec.grad_accum,
            fixed=fixed,
        )
        known = {
            p.name: r for r in groups[key] if (p := space.point_of(r.spec, factory.request.base(stage))) is not None
        }
        names = ", ".join(SHORT_KEYS.get(d.key, d.key.rsplit(".", 1)[-1]) or d.key for d in space.dims)
        record.note(f"stage {stage}: searching {space.size} configurations ({names}) with {at.tuner_type}")
        searcher = SEARCHERS[at.tuner_type](
            space, metric=at.metric, check=_checker(factory, stage, fixed, groups[key]), known=known, seed=SEED
        )
        yield searcher, EarlyStopping(at.tuner_early_stopping, at.metric, overall.best)


def _knobbed(spec: TrialSpec) -> bool:
    """A trial of a knob search (it sets a knob beyond offload)."""
    return any(
        not k.startswith(("zero_optimization.offload_", "zero_force_ds_cpu_optimizer")) for k, _ in spec.overrides
    )


def _around(factory: TrialFactory, mb: int) -> tuple[int, ...]:
    """The best micro-batch and its neighbours among the candidates: smaller buckets may make
    room for the next size up, and the memory check prunes it where they do not."""
    cands = factory.candidates()
    i = cands.index(mb) if mb in cands else min(range(len(cands)), key=lambda j: abs(cands[j] - mb))
    return tuple(cands[max(0, i - 1) : i + 2])


def _checker(factory: TrialFactory, stage: int, fixed: tuple, measured: list[TrialResult]):
    """Invalid combinations and memory: the stage's fitted peak plus what the point's knobs
    change in the analytic terms (bucket sizes), with the fit's uncertainty as margin."""
    model = factory.memory_model({stage: fixed})
    for r in measured:
        model.observe(r)
    base = factory.request.base(stage)

    def check(spec: TrialSpec) -> str | None:
        cfg = trial_config(base, spec, factory.dp)
        reason = invalid_reason(stage, cfg)
        if reason or not factory.budget:
            return reason
        fit, n = model.fit(stage), model.num_params
        if fit is None or n is None:
            return None
        delta = model_states(MemorySetup.from_config(cfg, num_params=n, dp=factory.dp, mp=factory.mp)) - model_states(
            model.setup_for(stage, n)
        )
        predicted, margin = fit.predict(spec.micro_batch) + delta, Z * fit.uncertainty(spec.micro_batch)
        if predicted + margin > factory.budget:
            return f"predicted {format_size(predicted)} ± {format_size(margin)} > budget {format_size(factory.budget)}"
        return None

    return check
