"""The calibrated memory model: fits, their uncertainty, and transfer to unmeasured stages."""
import random

import pytest

from zerotune.memory import PRIOR_REL, TRANSFER_REL, Z, MemoryModel, model_states
from zerotune.memory_terms import MemorySetup
from zerotune.trial import TrialResult, TrialSpec, TrialState

MIB = 1024**2


def ok(stage, mb, peak, static, num_params=100_000_000):
    return TrialResult(spec=TrialSpec(stage=stage, micro_batch=mb), state=TrialState.OK, peak_memory=[peak, peak],
                       static_memory=[static, static], num_params=num_params)


def setup_for(stage, n):
    return MemorySetup(num_params=n, dp=2, stage=stage, reduce_bucket_size=5e8, allgather_bucket_size=5e8,
                       overlap_comm=stage == 3, prefetch_bucket_size=5e7)


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
        m.observe(ok(0, mb, int(overhead + model_states(setup_for(0, n)) + act * mb),
                     int(overhead + model_states(setup_for(0, n))), n))
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
