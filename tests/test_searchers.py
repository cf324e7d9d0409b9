"""One suite every knob searcher passes (as Optuna tests every sampler), plus early stopping."""

import math

import pytest

from zerotune.request._space import MICRO_BATCH, Dimension, Space
from zerotune.search import SEARCHERS, EarlyStopping
from zerotune.trials._trial import Measurement, TrialResult, TrialSpec, TrialState

RBS = "zero_optimization.reduce_bucket_size"
OC = "zero_optimization.overlap_comm"
CG = "zero_optimization.contiguous_gradients"


def space(**kw):
    dims = (
        Dimension(RBS, (5e7, 5e8, 1e9)),
        Dimension(OC, (True, False)),
        Dimension(CG, (False, True)),
        Dimension(MICRO_BATCH, (2, 4, 8, 16)),
    )
    return Space(stage=2, dims=dims, global_batch=64, dp=2, **kw)


def landscape(spec: TrialSpec) -> float:
    """Throughput: rises with the micro-batch, best at rbs 5e8 with overlap on; 16 does not fit."""
    k = dict(spec.overrides)
    return (
        100
        * (1 - math.exp(-spec.micro_batch / 4))
        * (1.15 if k[OC] else 1.0)
        * (1.0 if k[RBS] == 5e8 else 0.9)
        * (1.03 if k[CG] else 1.0)
    )


def measure(spec: TrialSpec) -> TrialResult:
    if spec.micro_batch == 16:
        return TrialResult(spec=spec, state=TrialState.OOM, reason="CUDA out of memory")
    samples = spec.micro_batch * spec.grad_accum * 2
    step = samples / landscape(spec)
    return TrialResult(
        spec=spec,
        state=TrialState.OK,
        measurement=Measurement(
            samples_per_step=samples,
            step_time_mean=step,
            step_time_std=0.0,
            step_time_ci95=step * 0.005,
            steps_measured=10,
            stable=True,
        ),
    )


def run(searcher, limit=1000):
    launched, pruned = [], []
    while (s := searcher.suggest()) is not None and len(launched) + len(pruned) < limit:
        if s.prune_reason:
            pruned.append(s.spec)
            searcher.observe(TrialResult(spec=s.spec, state=TrialState.PRUNED, reason=s.prune_reason))
        else:
            launched.append(s.spec)
            searcher.observe(measure(s.spec))
    return launched, pruned


BEST = max((p for p in space() if p.micro_batch != 16), key=landscape)


@pytest.fixture(params=sorted(SEARCHERS))
def make(request):
    def make(**kw):
        return SEARCHERS[request.param](space(), metric="throughput", seed=kw.pop("seed", 0), **kw)

    make.kind = request.param
    return make


def test_visits_every_point_once_and_then_stops(make):
    launched, pruned = run(make())
    names = [p.name for p in launched]
    assert len(names) == len(set(names)) == space().size == 48
    assert BEST.name in names


def test_same_seed_same_trials_so_a_rerun_resumes(make):
    assert [p.name for p in run(make(seed=3), limit=12)[0]] == [p.name for p in run(make(seed=3), limit=12)[0]]


def test_points_failing_the_check_are_pruned_not_launched(make):
    launched, pruned = run(
        make(check=lambda spec: "predicted 9 GiB > budget 8 GiB" if spec.micro_batch == 16 else None)
    )
    assert all(p.micro_batch == 16 for p in pruned) and len(pruned) == 12
    assert not [p for p in launched if p.micro_batch == 16]


def test_known_results_are_used_instead_of_a_trial(make):
    known = {BEST.name: measure(BEST)}
    launched, _ = run(make(known=known))
    assert BEST.name not in [p.name for p in launched] and len(launched) == 47


def test_trial_names_carry_every_knob_short():
    assert BEST.name == "z2_mb8_gas4_rbs=5e8_oc=on_cg=on"


def test_model_based_starts_from_the_prior_and_needs_fewer_trials_than_grid():
    mb = SEARCHERS["model_based"](space(), metric="throughput", seed=0)
    first = mb.suggest().spec
    assert first.micro_batch == 16 and dict(first.overrides)[RBS] == 5e8  # largest micro-batch, DeepSpeed defaults

    def trials_to_best(kind, seed):
        launched, _ = run(SEARCHERS[kind](space(), metric="throughput", seed=seed))
        return next(
            i + 1 for i, p in enumerate(launched) if landscape(p) >= 0.98 * landscape(BEST) and p.micro_batch != 16
        )

    model = sum(trials_to_best("model_based", s) for s in range(3)) / 3
    grid = trials_to_best("gridsearch", 0)
    assert model < grid


def ok(value, ci=0.01):
    spec = TrialSpec(stage=2, micro_batch=4)
    return TrialResult(
        spec=spec,
        state=TrialState.OK,
        measurement=Measurement(
            samples_per_step=int(value),
            step_time_mean=1.0,
            step_time_std=0.0,
            step_time_ci95=ci,
            steps_measured=5,
            stable=True,
        ),
    )


def test_early_stopping_counts_trials_without_a_real_improvement():
    stop = EarlyStopping(3, "throughput", best=ok(100))
    assert not stop.observe(ok(100))  # equal: 1
    assert not stop.observe(ok(101))  # better within noise (1%): 2, but it becomes the best
    assert not stop.observe(ok(120))  # a real improvement: reset
    assert not stop.observe(TrialResult(spec=TrialSpec(stage=2, micro_batch=8), state=TrialState.PRUNED))
    assert not stop.observe(TrialResult(spec=TrialSpec(stage=2, micro_batch=8), state=TrialState.OOM))
    assert not stop.observe(ok(90))
    assert stop.observe(ok(119)) and "tuner_early_stopping=3" in stop.reason
