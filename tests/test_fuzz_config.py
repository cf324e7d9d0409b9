"""Property-based: every malformed ds_config or autotuning section gives a ZerotuneError with a
message, never a traceback of another kind."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerotune import ZerotuneError
from zerotune.models._memory_terms import MemorySetup
from zerotune.request._config import AutotuningConfig, parse_request
from zerotune.request._space import Space, stage_dimensions, trial_config
from zerotune.trials._trial import TrialSpec

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["all", "auto", "cpu", "nvme", "none", 0, 1, 2, 3, 5e8, -1, 1e30]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
AUTOTUNING_KEYS = list(AutotuningConfig.model_fields) + ["unknown_key"]
ZERO_KEYS = [
    "stage",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "offload_optimizer",
    "offload_param",
    "stage3_prefetch_bucket_size",
    "contiguous_gradients",
    "sub_group_size",
]
TOP_KEYS = [
    "train_micro_batch_size_per_gpu",
    "train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "fp16",
    "optimizer",
]

autotuning = st.one_of(values, st.dictionaries(st.sampled_from(AUTOTUNING_KEYS), values, max_size=6))
offload = st.one_of(values, st.fixed_dictionaries({"device": st.one_of(values, st.lists(scalars, max_size=3))}))
zero = st.one_of(values, st.dictionaries(st.sampled_from(ZERO_KEYS), st.one_of(values, offload), max_size=5))
ds_config = st.one_of(
    values,
    st.fixed_dictionaries(
        {}, optional={"autotuning": autotuning, "zero_optimization": zero, **{k: values for k in TOP_KEYS}}
    ),
)


def tune_inputs(config, world):
    """What Autotuner does with a config before any process starts."""
    request = parse_request(config, world_size=world)
    for stage in request.stages:
        dims = stage_dimensions(stage, request.space_config, defaults=True)
        space = Space(stage=stage, dims=tuple(dims), global_batch=None, dp=world)
        assert space.size >= 1
        cfg = trial_config(request.base(stage), TrialSpec(stage=stage, micro_batch=1), world)
        json.dumps(cfg)
        MemorySetup.from_config(cfg, num_params=1000, dp=world)
    return request


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ds_config, st.integers(1, 16))
def test_any_ds_config_is_accepted_or_a_clear_error(config, world):
    try:
        tune_inputs(config, world)
    except ZerotuneError as e:
        assert str(e).strip(), "an error must say what is wrong"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_any_file_text_is_accepted_or_a_clear_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "ds.json"
    path.write_text(text)
    try:
        tune_inputs(str(path), 2)
    except ZerotuneError as e:
        assert str(path) in str(e) or str(e).strip()
