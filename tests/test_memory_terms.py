"""The memory model's terms against hand-computed cases and DeepSpeed's published ZeRO formulas."""

import pytest

from zerotune.models._memory_terms import MemorySetup, estimate, largest_micro_batch

P, G, LAYER = 1_000_000_000, 8, 50_000_000
NO_BUFFERS = dict(reduce_bucket_size=0, allgather_bucket_size=0, prefetch_bucket_size=0)


def states(**kw):
    b = estimate(MemorySetup(num_params=P, dp=G, largest_layer=LAYER, precision="fp16", **NO_BUFFERS, **kw), 1)
    return b.device["params"] + b.device["gradients"] + b.device["optimizer"], b


@pytest.mark.parametrize(
    "kw, deepspeed",
    [
        # DeepSpeed's estimate_zero2_model_states_mem_needs / estimate_zero3_... (GPU side)
        (dict(stage=2), 2 * P + 18 * P / G),
        (dict(stage=2, offload_optimizer="cpu"), 2 * P),
        (dict(stage=3), 4 * LAYER + 18 * P / G),
        (dict(stage=3, offload_optimizer="cpu"), 4 * LAYER + 2 * P / G),
        (dict(stage=3, offload_optimizer="cpu", offload_param="cpu"), 4 * LAYER),
    ],
)
def test_model_states_match_deepspeeds_formulas(kw, deepspeed):
    device, _ = states(**kw)
    assert device == pytest.approx(deepspeed)


def test_stage_0_and_1_and_fp32_by_hand():
    assert states(stage=0)[0] == pytest.approx((2 + 2 + 16) * P)
    assert states(stage=1)[0] == pytest.approx((2 + 2) * P + 16 * P / G)
    b = estimate(MemorySetup(num_params=P, dp=G, precision="fp32", stage=0, **NO_BUFFERS), 1)
    assert b.device_total == pytest.approx((4 + 4 + 8) * P)


def test_offload_moves_states_to_the_host():
    _, b = states(stage=3, offload_optimizer="cpu", offload_param="cpu")
    assert b.host["optimizer"] == pytest.approx(16 * P / G) and b.host["params"] == pytest.approx(2 * P / G)
    assert states(stage=2)[1].host_total == 0


def test_buffers_activations_and_overhead_are_their_own_terms():
    s = MemorySetup(
        num_params=1000,
        precision="fp16",
        stage=2,
        reduce_bucket_size=500,
        allgather_bucket_size=5000,
        overlap_comm=True,
        activation_per_sample=10.0,
        overhead=7.0,
    )
    b = estimate(s, micro_batch=4)
    assert b.device["buffers"] == 2 * 500 * 2 + 2 * 1000  # two reduce buckets; allgather capped at the model
    assert b.device["activations"] == 40 and b.device["overhead"] == 7
    assert set(b.device) == {"params", "gradients", "optimizer", "buffers", "activations", "overhead"}


def test_largest_micro_batch_that_fits():
    s = MemorySetup(num_params=1000, stage=0, activation_per_sample=100.0, overhead=0.0, **NO_BUFFERS)
    base = estimate(s, 0).device_total  # 16 kB of states
    assert largest_micro_batch(s, base + 450, [1, 2, 4, 8]) == 4
    assert largest_micro_batch(s, base - 1, [1, 2]) is None


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(num_params=0), "positive"),
        (dict(stage=4), "0-3"),
        (dict(precision="fp8"), "precision"),
        (dict(stage=2, offload_param="cpu"), "stage 3"),
        (dict(stage=0, offload_optimizer="cpu"), "stage 1"),
    ],
)
def test_impossible_setups_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        MemorySetup(**{"num_params": 10, **kw})
