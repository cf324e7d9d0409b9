"""The calibrated memory model: fits, their uncertainty, and transfer to unmeasured stages."""

import random

import pytest

from zerotune.models._memory import PRIOR_REL, TRANSFER_REL, MemoryModel, Z, model_states
from zerotune.models._memory_terms import MemorySetup
from zerotune.trials._trial import TrialResult, TrialSpec, TrialState

MIB = 1024**2


def ok(stage, mb, peak, static, num_params=100_000_000):
    return TrialResult(
        spec=TrialSpec(stage=stage, micro_batch=mb),
        state=TrialState.OK,
        peak_memory=[peak, peak],
        static_memory=[static, static],
        num_params=num_params,
    )


def setup_for(stage, n):
    return MemorySetup(
        num_params=n,
        dp=2,
        stage=stage,
        reduce_bucket_size=5e8,
        allgather_bucket_size=5e8,
        overlap_comm=stage == 3,
        prefetch_bucket_size=5e7,
    )


def test_two_points_give_static_and_per_sample_with_the_prior_spread():
    m = MemoryModel(dp=2, mixed_precision=False)
    m.observe(ok(2, 4, 1400 * MIB, 900 * MIB))
    m.observe(ok(2, 16, 2600 * MIB, 900 * MIB))
    fit = m.fit(2)
    assert fit.exact and fit.per_sample == pytest.approx(100 * MIB) and fit.static == pytest.approx(1000 * MIB)
    assert fit.sigma == pytest.approx(PRIOR_REL * 2000 * MIB)  # two points show no spread: the prior
    # The interval widens away from the measured micro-batches.
    assert fit.uncertainty(10) < fit.uncertainty(4) < fit.uncertainty(64)
    assert fit.lower(8) < fit.predict(8) < fit.upper(8)


def test_spread_of_noisy_points_is_measured():
    rng = random.Random(0)
    m = MemoryModel(dp=2, mixed_precision=False)
    noise = 60 * MIB
    for mb in [1, 2, 4, 8, 16, 32] * 4:
        m.observe(ok(1, mb, int(3000 * MIB + 50 * MIB * mb + rng.gauss(0, noise)), 2900 * MIB))
    fit = m.fit(1)
    assert fit.per_sample == pytest.approx(50 * MIB, rel=0.1)
    assert 0.6 * noise < fit.sigma < 1.5 * noise  # above the 2% prior (about 40 MiB here)
    # About 95% of fresh peaks fall under upper().
    fresh = [(mb, 3000 * MIB + 50 * MIB * mb + rng.gauss(0, noise)) for mb in [1, 3, 8, 20, 32] * 40]
    assert sum(p <= fit.upper(mb) for mb, p in fresh) / len(fresh) > 0.9


def test_one_point_over_estimates_the_slope_and_only_its_static_is_a_sure_minimum():
    m = MemoryModel(dp=2, mixed_precision=False)
    m.observe(ok(0, 8, 2000 * MIB, 1200 * MIB))
    fit = m.fit(0)
    assert not fit.exact and fit.per_sample == pytest.approx(100 * MIB)
    assert fit.upper(8) == fit.predict(8) == 2000 * MIB
    assert fit.lower(1) == 1200 * MIB


def test_an_unmeasured_stage_gets_analytic_states_plus_fitted_residual_and_a_transfer_spread():
    n = 100_000_000
    m = MemoryModel(dp=2, mixed_precision=False, setup_for=setup_for)
    overhead, act = 300 * MIB, 80 * MIB
    for mb in (4, 16):
        m.observe(
            ok(
                0,
                mb,
                int(overhead + model_states(setup_for(0, n)) + act * mb),
                int(overhead + model_states(setup_for(0, n))),
                n,
            )
        )
    fit3 = m.fit(3)
    truth3 = overhead + model_states(setup_for(3, n)) + act * 8
    assert fit3.predict(8) == pytest.approx(truth3, rel=1e-6)
    change = model_states(setup_for(0, n)) - model_states(setup_for(3, n))
    assert fit3.transfer == pytest.approx(TRANSFER_REL * change)
    assert fit3.uncertainty(8) > m.fit(0).uncertainty(8)


def test_measured_stages_that_disagree_widen_the_transfer():
    n = 100_000_000
    agree, disagree = (MemoryModel(dp=2, mixed_precision=False, setup_for=setup_for) for _ in range(2))
    for model, extra in ((agree, 0), (disagree, 400 * MIB)):
        for stage, more in ((0, 0), (1, extra)):
            for mb in (4, 16):
                states = model_states(setup_for(stage, n))
                model.observe(ok(stage, mb, int(300 * MIB + more + states + 80 * MIB * mb), int(300 * MIB + states), n))
    assert disagree.fit(3).transfer > agree.fit(3).transfer + 100 * MIB


def test_lower_bound_before_any_trial_is_the_model_states_when_the_size_is_known():
    assert MemoryModel(dp=2, mixed_precision=False).lower_bound(0, 1) is None
    m = MemoryModel(dp=2, mixed_precision=False, setup_for=setup_for, num_params=100_000_000)
    assert m.lower_bound(1, 1) == pytest.approx(model_states(setup_for(1, 100_000_000)) * (1 - Z * TRANSFER_REL))


def test_an_out_of_memory_trial_sets_a_floor_under_its_own_and_smaller_micro_batches():
    """What a trial held when it ran out at micro-batch 8 (its static 160 MiB read before the
    first forward): at 8 and above at least that, below it at least the line from the static to
    it, less the prior spreads; per stage and overrides, and never from OK trials."""
    m = MemoryModel(dp=2, mixed_precision=False)
    m.observe(ok(1, 4, 500 * MIB, 100 * MIB))
    assert m.floor(1, 2) is None
    oom = TrialResult(
        spec=TrialSpec(stage=1, micro_batch=8),
        state=TrialState.OOM,
        peak_memory=[2000 * MIB, 1800 * MIB],
        static_memory=[160 * MIB, 150 * MIB],
    )
    m.observe(oom)
    margin = 1 - Z * PRIOR_REL
    need, at = m.floor(1, 2)
    assert at.micro_batch == 8 and need == pytest.approx((2000 / 4 + 160 * 3 / 4) * MIB * margin)
    assert m.floor(1, 8)[0] == m.floor(1, 32)[0] == pytest.approx(2000 * MIB * margin)
    assert m.floor(2, 2) is None and m.floor(1, 2, (("zero_optimization.offload_optimizer.device", "cpu"),)) is None
    assert [p.micro_batch for p in m.points[1]] == [4]  # the fit is the OK trials' alone
    # A second, tighter failure at a smaller micro-batch raises the floor below it.
    m.observe(
        TrialResult(
            spec=TrialSpec(stage=1, micro_batch=2),
            state=TrialState.OOM,
            peak_memory=[1900 * MIB],
            static_memory=[160 * MIB],
        )
    )
    assert m.floor(1, 2)[1].micro_batch == 2
    assert m.floor(1, 1)[0] == pytest.approx((1900 / 2 + 160 / 2) * MIB * margin)
