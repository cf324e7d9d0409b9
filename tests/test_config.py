import json

import pytest

from zerotune import ConfigError
from zerotune.request._config import AutotuningConfig, load_ds_config, parse_request
from zerotune.trials import TrialSpec


def req(cfg, world=2):
    return parse_request(cfg, world_size=world)


def test_deepspeed_defaults():
    at = AutotuningConfig()
    assert (at.fast, at.metric, at.start_profile_step, at.end_profile_step) == (True, "throughput", 3, 5)
    assert (at.tuner_type, at.tuner_early_stopping, at.tuner_num_trials) == ("gridsearch", 5, 50)
    assert (at.min_train_micro_batch_size_per_gpu, at.max_train_micro_batch_size_per_gpu) == (1, 1024)
    assert at.num_tuning_micro_batch_sizes == 3 and at.mp_size == 1


def test_every_deepspeed_key_is_accepted():
    section = {
        "enabled": True,
        "fast": False,
        "results_dir": "r",
        "exps_dir": "e",
        "overwrite": True,
        "metric": "latency",
        "metric_path": None,
        "start_profile_step": 2,
        "end_profile_step": 6,
        "tuner_type": "model_based",
        "tuner_early_stopping": 3,
        "tuner_num_trials": 10,
        "arg_mappings": {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"},
        "max_train_batch_size": 64,
        "min_train_micro_batch_size_per_gpu": 2,
        "max_train_micro_batch_size_per_gpu": 16,
        "num_tuning_micro_batch_sizes": 4,
        "mp_size": 1,
        "model_info": {"profile": False, "num_params": 1000, "hidden_size": 64, "num_layers": 2},
        "model_info_path": None,
    }
    r = req({"autotuning": section})
    assert r.autotuning.tuner_type == "model_based" and r.global_batch == 64


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"autotuning\.tuner_typ: unknown key; did you mean 'tuner_type'"):
        req({"autotuning": {"tuner_typ": "random"}})
    with pytest.raises(ConfigError, match=r"autotuning\.model_info\.hidden: unknown key"):
        req({"autotuning": {"model_info": {"hidden": 3}}})


SECTION = {"autotuning": {"enabled": True}}
"""A config with an autotuning section: DeepSpeed's meanings."""


@pytest.mark.parametrize("stage, expected", [(None, [0, 1, 2, 3]), ("all", [0, 1, 2, 3]), (2, [2]), ([3, 1], [1, 3])])
def test_stage_forms_with_an_autotuning_section_mean_what_deepspeed_reads(stage, expected):
    cfg = {**SECTION, "zero_optimization": {"stage": stage}} if stage is not None else dict(SECTION)
    assert req(cfg).stages == expected


@pytest.mark.parametrize("stage", [4, -1, "two", [], [1, 5], True])
def test_invalid_stage(stage):
    with pytest.raises(ConfigError, match="zero_optimization.stage"):
        req({"zero_optimization": {"stage": stage}})


@pytest.mark.parametrize(
    "mb, expected, floor", [("auto", None, 1), (None, None, 1), (8, None, 8), ([8], [8], 1), ([16, 4], [4, 16], 1)]
)
def test_micro_batch_forms_with_an_autotuning_section_mean_what_deepspeed_reads(mb, expected, floor):
    # An int is where the search starts, upwards (DeepSpeed's autotuner runs it first, then
    # larger ones); a list is the candidates, and a list of one fixes it.
    cfg = {**SECTION, "train_micro_batch_size_per_gpu": mb} if mb is not None else dict(SECTION)
    r = req(cfg)
    assert r.micro_batches == expected and r.autotuning.min_train_micro_batch_size_per_gpu == floor


PRODUCTION = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}
"""A config that trains as it stands: no autotuning section."""


@pytest.mark.parametrize("section", [None, {"enabled": False}], ids=["no section", "enabled false"])
def test_a_config_that_trains_as_it_stands_is_tuned_around_the_users_own(section):
    cfg = {**PRODUCTION, **({"autotuning": section} if section else {})}
    r = req(cfg)
    assert r.own == TrialSpec(stage=2, micro_batch=4, grad_accum=8) and r.global_batch == 64
    assert r.stages == [0, 1, 2, 3] and r.micro_batches is None and r.around == {"stage", "micro-batch"}
    assert r.autotuning.fast and r.offload is None and r.space_config["optimizer"] == PRODUCTION["optimizer"]


@pytest.mark.parametrize(
    "search, stages, micro_batches, fast, offload",
    [
        ("stage", [0, 1, 2, 3], [4], True, False),
        ("micro-batch", [2], None, True, False),
        ("stage,micro-batch,offload,knobs", [0, 1, 2, 3], None, False, True),
        (["knobs"], [2], [4], False, False),
    ],
)
def test_search_names_what_is_searched_around_it(search, stages, micro_batches, fast, offload):
    from zerotune.request import parse_search

    r = parse_request(PRODUCTION, world_size=2, search=parse_search(search))
    assert (r.stages, r.micro_batches, r.autotuning.fast, r.offload) == (stages, micro_batches, fast, offload)
    assert r.own == TrialSpec(stage=2, micro_batch=4, grad_accum=8) and r.global_batch == 64


def test_what_search_leaves_out_stays_as_the_config_trains_with_it():
    from zerotune.request import parse_search

    # No stage: DeepSpeed's default, 0; no micro-batch: the one train_batch_size gives.
    r = parse_request({"train_batch_size": 32}, world_size=2, search=parse_search("knobs"))
    assert (r.stages, r.micro_batches) == ([0], [16]) and r.own == TrialSpec(stage=0, micro_batch=16, grad_accum=1)


def test_a_config_that_offloads_searches_offload_around_it():
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    r = req({**PRODUCTION, "zero_optimization": zero})
    assert r.around == {"stage", "micro-batch", "offload"} and r.offload is True


def test_the_users_global_batch_is_kept_where_only_the_micro_batch_gives_it():
    r = req({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}})
    assert r.global_batch == 8 * 2 * 2 and r.own == TrialSpec(stage=1, micro_batch=8, grad_accum=2)


@pytest.mark.parametrize(
    "cfg",
    [
        {**SECTION, "zero_optimization": {"stage": [1, 2]}, "train_micro_batch_size_per_gpu": 4},
        {**SECTION, "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"},
        {**PRODUCTION, "zero_optimization": {"stage": 2, "reduce_bucket_size": [5e7, 5e8]}},
    ],
    ids=["stage list", "auto micro-batch", "knob list"],
)
def test_a_config_that_leaves_a_choice_to_the_search_names_no_own_config(cfg):
    assert req(cfg).own is None


def test_an_unknown_search_name_is_refused_with_the_known_ones():
    from zerotune.request import parse_search

    with pytest.raises(ConfigError, match="--search precision: .*stage, micro-batch, offload, knobs"):
        parse_search("stage,precision")
    for empty in ("", ",,,", [], " "):
        with pytest.raises(ConfigError, match="names nothing to search"):
            parse_search(empty)
    assert parse_search("stage\nknobs") == parse_search("stage, knobs") == {"stage", "knobs"}


def test_min_above_max():
    with pytest.raises(ConfigError, match="min_train_micro_batch_size_per_gpu .* is above"):
        req({"autotuning": {"min_train_micro_batch_size_per_gpu": 64, "max_train_micro_batch_size_per_gpu": 8}})


def test_global_batch_not_divisible_by_data_parallel_size():
    with pytest.raises(ConfigError, match="cannot be split over 2 data-parallel"):
        req({"autotuning": {"max_train_batch_size": 33}})


def test_mp_size_must_divide_world():
    with pytest.raises(ConfigError, match="mp_size"):
        req({"autotuning": {"mp_size": 3}}, world=2)


def test_bad_metric_value():
    with pytest.raises(ConfigError, match="autotuning.metric"):
        req({"autotuning": {"metric": "speed"}})


def test_user_train_batch_size_fixes_the_global_batch():
    assert req({"train_batch_size": 32}).global_batch == 32


def test_malformed_json(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text('{"train_batch_size": 8,}')  # DeepSpeed's HJSON reader takes one trailing comma
    assert load_ds_config(p) == {"train_batch_size": 8}
    p.write_text('{"train_batch_size": 8,,}')
    with pytest.raises(ConfigError, match=r"not valid JSON: .* line 1"):
        load_ds_config(p)


def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_ds_config(tmp_path / "nope.json")


def test_autotuning_section_is_removed_from_base_config():
    r = req({"autotuning": {"fast": True}, "fp16": {"enabled": True}})
    assert "autotuning" not in r.base(0) and r.base(0)["fp16"] == {"enabled": True}
    assert json.dumps(r.base(0))


def test_a_null_in_the_micro_batch_list_is_a_clear_error():
    import pytest

    from zerotune._errors import ConfigError
    from zerotune.request._config import parse_request

    with pytest.raises(ConfigError, match="holds null"):
        parse_request({"train_micro_batch_size_per_gpu": [None, 1]}, world_size=1)
