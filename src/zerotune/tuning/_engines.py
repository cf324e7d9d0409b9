"""Choosing across engines only where they train the same numbers.

DeepSpeed and FSDP2 differ in more than speed: the dtype of the weights the optimizer updates,
of the passes and of the gradient reduction (see zerotune.request's ``numerics``). zerotune ranks
an FSDP2 configuration against DeepSpeed's only where the two train in the same dtypes, and where
the losses of their first optimizer steps agree: a DeepSpeed and an FSDP2 trial of the same
micro-batch and accumulation see the same samples in the same order on every rank, so their mean
losses per step differ by the reduction order's rounding only. Each trajectory is read relative
to its first step: a framework may scale the loss its model returns by the accumulation or the
number of ranks differently under each engine (the Hugging Face Trainer does), a constant factor
that does not change what is trained. Where either check fails, the engine the program is not
configured for (FSDP2, for a program configured for DeepSpeed) is not ranked, and the summary
says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..request import numerics, numerics_line
from ..trials import TrialResult, TrialState, choose_best
from ..units import format_size

if TYPE_CHECKING:
    from ..results import TuningRecord
    from ._trial_factory import TrialFactory

LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
"""The largest difference of the first steps' losses, each relative to its own first step, at
which two engines train the same numbers, by compute dtype: fp32 rounding differs in the sixth or
seventh digit; bf16 keeps 8 bits of mantissa (about 0.4% a rounding), fp16 11, so a few steps
apart in reduction order stay within 2%."""
ENGINE_NAMES = {"deepspeed": "DeepSpeed", "fsdp": "FSDP2"}


def engine_numerics(factory: TrialFactory) -> dict[str, dict[str, str]]:
    """The dtypes each engine of the tuning trains in, with the user's precision."""
    precision = factory.fsdp.mixed_precision
    out = {}
    for engine in factory.engines:
        if engine == "fsdp":
            out[engine] = numerics("fsdp", {"mixed_precision": precision})
        else:
            config = dict(factory.request.space_config)
            config.pop("bf16", None), config.pop("fp16", None)
            if precision in ("bf16", "fp16"):
                config[precision] = {"enabled": True}  # the precision as the target resolves it ("auto")
            out[engine] = numerics("deepspeed", config)
    return out


def numerics_differ(factory: TrialFactory) -> str:
    """Why the engines train other numbers ("" where they train the same)."""
    found = engine_numerics(factory)
    if len({tuple(v.items()) for v in found.values()}) <= 1:
        return ""
    return "; ".join(f"{ENGINE_NAMES[e]} trains {numerics_line(v)}" for e, v in found.items())


def other_engine(factory: TrialFactory) -> str:
    """The engine the program is not configured for: the one left unranked where they differ."""
    return "deepspeed" if factory.target.engine == "fsdp" else "fsdp"


def check_numerics(record: TuningRecord, factory: TrialFactory) -> None:
    """Where the engines would train in other dtypes, the one the program is not configured for
    is not measured (its trials could not be ranked), and the summary names both."""
    if len(factory.engines) < 2 or not (why := numerics_differ(factory)):
        return
    other = other_engine(factory)
    record.unranked[other] = f"it would train other numbers ({why})"
    record.note(f"engines: {ENGINE_NAMES[other]} not measured: {record.unranked[other]}")


def loss_pair(trials: list[TrialResult], metric: str, margin: float) -> tuple[TrialResult, TrialResult] | None:
    """A DeepSpeed and an FSDP2 trial of the same micro-batch and accumulation that both read
    losses: the best FSDP2 trial's twin where there is one, else any such pair."""
    ok = [t for t in trials if t.state is TrialState.OK and t.losses]
    fsdp = [t for t in ok if t.spec.engine == "fsdp"]
    choice = choose_best(fsdp, metric, margin)
    order = ([choice.best] if choice else []) + [t for t in fsdp if choice is None or t is not choice.best]
    for f in order:
        for d in ok:
            if d.spec.engine == "deepspeed" and (d.spec.micro_batch, d.spec.grad_accum) == (
                f.spec.micro_batch,
                f.spec.grad_accum,
            ):
                return d, f
    return None


def check_losses(record: TuningRecord, factory: TrialFactory, metric: str, margin: float) -> None:
    """Compare the first steps' losses of the two engines (see the module's docs); the engine the
    program is not configured for is not ranked where they disagree beyond LOSS_TOLERANCE. The
    summary says what was compared."""
    other = other_engine(factory)
    if record.unranked or len({t.spec.engine for t in record.trials}) < 2:
        return
    pair = loss_pair(record.trials, metric, margin)
    if pair is None:
        record.note(
            "engines: no DeepSpeed and FSDP2 trial of the same micro-batch both read a loss (the model's "
            "forward returns it), so their first steps were not compared"
        )
        return
    d, f = pair
    steps = min(len(d.losses), len(f.losses))
    gap = max(abs(a / d.losses[0] - b / f.losses[0]) for a, b in zip(d.losses[:steps], f.losses[:steps]))
    compute = engine_numerics(factory)["fsdp"]["compute"]
    tolerance = LOSS_TOLERANCE[compute]
    seen = f"{d.name} {_losses(d)} against {f.name} {_losses(f)}, each over its first: at most {gap:.2g} apart"
    if gap <= tolerance:
        record.note(f"engines: the first {steps} steps' losses agree within {tolerance:g} ({seen})")
        return
    configured = ENGINE_NAMES[factory.target.engine]
    why = (
        f"its first {steps} steps' losses differ from {configured}'s beyond {tolerance:g} ({seen}); the two "
        "configurations train other numbers (gradient clipping, the optimizer or the scheduler set for one only?)"
    )
    record.unranked[other] = why
    record.note(f"engines: {ENGINE_NAMES[other]} not ranked: {why}")


def _losses(t: TrialResult) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in t.losses) + "]"


def engine_lines(
    record: TuningRecord,
    factory: TrialFactory,
    metric: str,
    margin: float,
    chosen: TrialResult | None,
    confirmed: dict[str, TrialResult],
) -> list[str]:
    """Per engine of a tuning over several: its best configuration, figure and peak memory, its
    dtypes, and why it lost to ``chosen`` (or was not ranked). Figures as the choice read them:
    ``confirmed``'s where a configuration was measured again."""
    if len(factory.engines) < 2:
        return []
    found = engine_numerics(factory)
    bests = {}
    for engine in factory.engines:
        if chosen is not None and chosen.spec.engine == engine:
            bests[engine] = confirmed.get(chosen.name, chosen)
            continue
        figures = [confirmed.get(t.name, t) for t in record.trials if t.spec.engine == engine]
        choice = choose_best(figures, metric, margin)
        bests[engine] = choice.best if choice else None
    chosen = confirmed.get(chosen.name, chosen) if chosen is not None else None
    lines = []
    for engine, best in bests.items():
        name = ENGINE_NAMES[engine]
        if best is None and engine in record.unranked:
            lines.append(f"engine {name}: not measured: {record.unranked[engine]}")
            continue
        if best is None:
            lines.append(f"engine {name}: no configuration succeeded ({numerics_line(found[engine])})")
            continue
        unit = "s/step" if metric == "latency" else "FLOP/s" if metric == "flops" else "samples/s"
        figure = f"{best.metric(metric):.4g} {unit}"
        status = f"not ranked: {record.unranked[engine]}" if engine in record.unranked else ""
        if not status and chosen is not None and chosen.spec.engine != engine:
            status = f"lost to {chosen.name} ({chosen.metric(metric):.4g} {unit})"
        elif not status and chosen is not None:
            status = "chosen"
        lines.append(
            f"engine {name}: best {best.name} ({best.spec.setting}), {figure}, peak {format_size(best.max_peak)}"
            f"/rank; {numerics_line(found[engine])}" + (f"; {status}" if status else "")
        )
    return lines
