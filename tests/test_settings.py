"""The Autotuner's options in three settings objects (where trials run, how each is measured,
what is searched): each option is a field of one of them, given whole or by its name."""

import dataclasses

import pytest

from fakes import FakeLauncher
from zerotune import Autotuner, ConfigError
from zerotune.launch import ClusterSettings
from zerotune.trials import MeasureSettings
from zerotune.tuning import GROUPS, SearchSettings


def make(tmp_path, script, make_config, gpu_node, **kw):
    return Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        results_dir=tmp_path / "r",
        launcher=FakeLauncher(),
        node=gpu_node,
        **kw,
    )


def test_settings_given_whole_and_by_name_are_the_same_tuning(tmp_path, script, make_config, gpu_node):
    whole = make(
        tmp_path,
        script,
        make_config,
        gpu_node,
        cluster=ClusterSettings(num_gpus=2, memory_per_device="6GiB"),
        measure=MeasureSettings(precision=0.05, max_steps=20),
        search=SearchSettings(time_budget="20m", offload=False),
    )
    named = make(
        tmp_path, script, make_config, gpu_node, num_gpus=2, memory_per_device="6GiB", precision=0.05,
        max_steps=20, time_budget="20m", offload=False,
    )  # fmt: skip
    for tuner in (whole, named):
        assert (tuner.num_gpus, tuner.budget, tuner.time_budget) == (2, 6 * 2**30, 1200.0)
        assert (tuner.measure.precision, tuner.measure.max_steps) == (0.05, 20)
        assert tuner.trials.offload is False
    assert (whole.cluster_settings, whole.measure, whole.search) == (
        named.cluster_settings,
        named.measure,
        named.search,
    )


def test_every_option_is_a_field_of_exactly_one_settings_object():
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names))


def test_a_field_given_whole_and_by_name_is_refused(tmp_path, script, make_config, gpu_node):
    with pytest.raises(ConfigError, match="num_gpus= is a field of cluster="):
        make(tmp_path, script, make_config, gpu_node, cluster=ClusterSettings(num_gpus=2), num_gpus=1)
    assert not (tmp_path / "r").exists()


def test_an_unknown_option_is_named_with_the_closest_field(tmp_path, script, make_config, gpu_node):
    with pytest.raises(ConfigError, match="unknown argument num_gpu=2; did you mean num_gpus="):
        make(tmp_path, script, make_config, gpu_node, num_gpu=2)


@pytest.mark.parametrize(
    "build, named",
    [
        (lambda: ClusterSettings(num_gpus="2"), "ClusterSettings(num_gpus=...)"),
        (lambda: ClusterSettings(warm_trials="no"), "ClusterSettings(warm_trials=...)"),
        (lambda: ClusterSettings(num_nodes=0), "--num-nodes 0 is out of range"),
        (lambda: SearchSettings(retry_failed=1), "SearchSettings(retry_failed=...)"),
        (lambda: SearchSettings(time_budget="soon"), "time_budget"),
        (lambda: SearchSettings(searcher="grid"), "SearchSettings(searcher=...)"),
    ],
)
def test_each_settings_object_checks_its_fields_when_built(build, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        build()


def test_the_old_name_of_the_time_budget_still_works_and_warns(tmp_path, script, make_config, gpu_node):
    with pytest.warns(FutureWarning, match="budget= is now called time_budget="):
        tuner = make(tmp_path, script, make_config, gpu_node, num_gpus=2, budget=60)
    assert tuner.time_budget == 60


def test_the_tie_margin_reaches_the_choice_and_the_results_read_back(tmp_path, script, make_config, gpu_node):
    from zerotune import load_results

    tuner = make(tmp_path, script, make_config, gpu_node, num_gpus=2, memory_per_device="6GiB", tie_margin=0.0)
    result = tuner.tune()
    assert result.tie_margin == 0.0 and load_results(tmp_path / "r").tie_margin == 0.0
    assert load_results(tmp_path / "r").best.name == result.best.name


@pytest.mark.parametrize("margin", [-0.01, 0.6, "3%", True])
def test_a_tie_margin_outside_0_to_half_is_refused(margin):
    with pytest.raises(ConfigError, match="tie_margin"):
        MeasureSettings(tie_margin=margin)
