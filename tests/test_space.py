"""Tuning spaces: defaults per stage, the user's lists, validity, names."""

import pytest

from zerotune import ConfigError
from zerotune.request._space import (
    MICRO_BATCH,
    Dimension,
    Space,
    collapse,
    invalid_reason,
    stage_dimensions,
    trial_config,
    user_dimensions,
)
from zerotune.trials._trial import TrialSpec

Z = "zero_optimization."


def keys(dims):
    return [d.key.removeprefix(Z) for d in dims]


def test_defaults_follow_deepspeeds_spaces():
    assert stage_dimensions(0, {}, defaults=True) == []
    z1 = stage_dimensions(1, {}, defaults=True)
    assert keys(z1) == ["reduce_bucket_size", "allgather_bucket_size"]
    assert z1[0].values == (5e7, 5e8, 1e9)
    z2 = stage_dimensions(2, {}, defaults=True)
    assert keys(z2) == [
        "overlap_comm",
        "reduce_scatter",
        "reduce_bucket_size",
        "allgather_bucket_size",
        "contiguous_gradients",
    ]
    assert Space(stage=2, dims=tuple(z2), global_batch=None, dp=1).size == 2 * 2 * 3 * 3 * 2  # DeepSpeed's 72
    z3 = keys(stage_dimensions(3, {}, defaults=True))
    assert "stage3_prefetch_bucket_size" in z3 and "allgather_bucket_size" not in z3  # stage 3 ignores it


def test_hidden_size_centres_the_buckets_as_hugging_face_does():
    dims = {d.key.removeprefix(Z): d.values for d in stage_dimensions(3, {}, defaults=True, hidden_size=1024)}
    h2 = 1024 * 1024
    assert h2 in dims["reduce_bucket_size"]
    assert float(int(0.9 * h2)) in dims["stage3_prefetch_bucket_size"]
    assert 10 * 1024 in dims["stage3_param_persistence_threshold"]


def test_user_lists_are_dimensions_and_user_values_are_kept():
    cfg = {
        "zero_optimization": {
            "stage": [1, 2],
            "overlap_comm": [True, False],
            "reduce_bucket_size": 2e8,
            "offload_optimizer": {"device": ["none", "cpu"]},
        },
        "train_micro_batch_size_per_gpu": [4, 8],
        "bf16": {"enabled": True},
        "autotuning": {"x": [1, 2]},
    }
    assert keys(user_dimensions(cfg)) == ["overlap_comm", "offload_optimizer.device"]
    z2 = keys(stage_dimensions(2, cfg, defaults=True))
    assert z2[:2] == ["overlap_comm", "offload_optimizer.device"]
    assert "reduce_bucket_size" not in z2  # the user set it: not searched
    assert keys(stage_dimensions(2, cfg, defaults=False)) == ["overlap_comm", "offload_optimizer.device"]
    assert keys(stage_dimensions(0, cfg, defaults=True)) == []  # neither knob means anything at stage 0
    first = collapse(cfg)["zero_optimization"]
    assert first["overlap_comm"] is True and first["offload_optimizer"] == {"device": "none"}


def test_stage_specific_knobs_apply_to_their_stages_only():
    cfg = {
        "zero_optimization": {
            "stage3_max_live_parameters": [1e8, 1e9],
            "reduce_scatter": [True, False],
            "offload_param": {"device": ["none", "cpu"]},
        }
    }
    assert keys(stage_dimensions(2, cfg, defaults=False)) == ["reduce_scatter"]
    assert keys(stage_dimensions(3, cfg, defaults=False)) == ["stage3_max_live_parameters", "offload_param.device"]


@pytest.mark.parametrize(
    "stage, zero, reason",
    [
        (2, {"offload_param": {"device": "cpu"}}, "offload_param needs ZeRO stage 3"),
        (0, {"offload_optimizer": {"device": "cpu"}}, "offload_optimizer needs ZeRO stage 1"),
        (3, {"offload_param": {"device": "nvme"}}, "nvme_path"),
        (3, {"offload_param": {"device": "nvme", "nvme_path": "/nvme"}}, None),
    ],
)
def test_invalid_combinations(stage, zero, reason):
    got = invalid_reason(stage, {"zero_optimization": zero})
    assert got == reason if reason is None else reason in got


def test_trial_config_fills_the_trial_and_leaves_auto_to_a_script_that_sets_it():
    base = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": "all"},
    }
    spec = TrialSpec(stage=2, micro_batch=4, grad_accum=2, overrides=((Z + "overlap_comm", True),))
    cfg = trial_config(base, spec, dp=2)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]) == (
        4,
        2,
        16,
    )
    assert cfg["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    hf = trial_config(base, spec, dp=2, script_fills={"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
    assert hf["train_micro_batch_size_per_gpu"] == hf["gradient_accumulation_steps"] == hf["train_batch_size"] == "auto"


def test_a_trial_config_gains_no_batch_key_the_script_fills():
    """With arg_mappings, batch keys the user left out stay out (Hugging Face's Trainer refuses
    a train_batch_size that disagrees with its own calculation); numbers stay numbers."""
    spec = TrialSpec(stage=1, micro_batch=4, grad_accum=2)
    mapped = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}
    left_out = trial_config({"train_micro_batch_size_per_gpu": "auto"}, spec, dp=2, script_fills=mapped)
    assert left_out == {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 1}}
    numbers = trial_config(
        {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "train_batch_size": 16},
        spec,
        dp=2,
        script_fills=mapped,
    )
    assert (
        numbers["train_micro_batch_size_per_gpu"],
        numbers["gradient_accumulation_steps"],
        numbers["train_batch_size"],
    ) == (4, 2, 16)
    # Only the micro-batch mapped: the accumulation the user left out is set, so the global batch holds.
    micro_only = trial_config({}, spec, dp=2, script_fills={"train_micro_batch_size_per_gpu"})
    assert micro_only == {"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}


def test_points_are_canonical_and_map_back_from_earlier_trials():
    space = Space(
        stage=2,
        dims=(
            Dimension(Z + "reduce_bucket_size", (5e7, 5e8)),
            Dimension(Z + "overlap_comm", (True, False)),
            Dimension(MICRO_BATCH, (4, 8)),
        ),
        global_batch=32,
        dp=2,
    )
    points = list(space)
    assert [p.name for p in points[:2]] == ["z2_mb4_gas4_rbs=5e7_oc=on", "z2_mb8_gas2_rbs=5e7_oc=on"]
    assert len({p.name for p in points}) == space.size == 8
    # A micro-batch trial without knobs ran DeepSpeed's defaults: reduce bucket 5e8, overlap off.
    plain = TrialSpec(stage=2, micro_batch=8, grad_accum=2)
    assert space.point_of(plain, {"zero_optimization": {}}).name == "z2_mb8_gas2_rbs=5e8_oc=off"
    assert space.point_of(plain, {"zero_optimization": {"reduce_bucket_size": 2e8}}) is None


def test_bad_lists():
    with pytest.raises(ConfigError, match="empty list"):
        user_dimensions({"zero_optimization": {"reduce_bucket_size": []}})
