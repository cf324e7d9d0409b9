"""AutotuneDeepSpeedStrategy's decisions in one process (no training): what a fit asks for, the
fingerprint, applying a tuned config, the cache and the torchrun/SLURM case."""

import json
from pathlib import Path

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from zerotune import ConfigError  # noqa: E402
from zerotune.lightning import AutotuneDeepSpeedStrategy  # noqa: E402
from zerotune.targets._lightning_fit import apply_tuned, describe  # noqa: E402
from zerotune.targets._lightning_program import write_cache  # noqa: E402


class Model(L.LightningModule):
    def __init__(self, width=16):
        super().__init__()
        self.net = torch.nn.Linear(width, 1)


class Data(L.LightningDataModule):
    def __init__(self, batch_size=8):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(64, 16)), batch_size=self.batch_size)


def trainer(tmp_path, **kw):
    strategy = AutotuneDeepSpeedStrategy(cache_dir=tmp_path / "cache", **kw)
    return L.Trainer(accelerator="cpu", devices=2, strategy=strategy, accumulate_grad_batches=2, logger=False)


def test_describe_reads_what_fit_asks_for(tmp_path):
    t = trainer(tmp_path)
    job = describe(t.strategy, t, Model(), Data(batch_size=4))
    assert (job.world_size, job.batch_size, job.batch_size_attr, job.accumulate_grad_batches) == (2, 4, "datamodule", 2)
    assert job.global_batch == 16 and job.stages == [0, 1, 2, 3] and job.fingerprint
    assert job.cache_dir == str(tmp_path / "cache")


def test_stage_given_to_the_strategy_fixes_the_search(tmp_path):
    t = trainer(tmp_path, stage=3)
    assert describe(t.strategy, t, Model(), Data()).stages == [3]
    t = trainer(tmp_path, stages=[1, 2])
    assert describe(t.strategy, t, Model(), Data()).stages == [1, 2]


def test_without_an_attribute_the_dataloader_gives_the_micro_batch(tmp_path):
    t = trainer(tmp_path)
    loader = DataLoader(TensorDataset(torch.zeros(8, 16)), batch_size=2)
    job = describe(t.strategy, t, Model(), None, loader)
    assert (job.batch_size, job.batch_size_attr) == (2, None)


def test_fingerprint_follows_model_batch_and_precision(tmp_path):
    def fp(model=None, data=None, **kw):
        t = trainer(tmp_path, **kw)
        return describe(t.strategy, t, model or Model(), data or Data()).fingerprint

    same = fp()
    assert fp() == same
    assert fp(Model(width=32)) != same
    assert fp(data=Data(batch_size=16)) != same
    assert fp(stages=[2]) != same
    t = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=AutotuneDeepSpeedStrategy(cache_dir=tmp_path),
        precision="bf16-mixed",
        accumulate_grad_batches=2,
        logger=False,
    )
    assert describe(t.strategy, t, Model(), Data()).fingerprint != same


def test_apply_tuned_sets_batch_size_and_accumulation_never_the_config_key(tmp_path):
    t = trainer(tmp_path)
    model, data = Model(), Data()
    t.strategy._lightning_module = model
    t._data_connector.attach_data(model, datamodule=data)
    t.strategy.set_world_ranks()
    config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2, "train_batch_size": 16}
    assert apply_tuned(t.strategy, t, config) == (2, 4)
    assert data.batch_size == 2 and t.accumulate_grad_batches == 4
    assert t.strategy.config == {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2}


def test_started_outside_lightning_without_a_cached_result_is_a_clear_error(tmp_path):
    t = trainer(tmp_path)
    with pytest.raises(ConfigError, match="started outside Lightning.*zerotune tune --num-gpus 2"):
        t.strategy.tuning.resolve(t.strategy, t, Model(), Data(), None, can_tune=False, required=True)
    t.strategy.tuning.resolve(t.strategy, t, Model(), Data(), None, can_tune=False, required=False)  # validate/test
    assert t.strategy.tuned_config is None


def test_a_cached_result_is_used_without_tuning(tmp_path):
    from zerotune.results._result import TuningResult

    t = trainer(tmp_path)
    job = describe(t.strategy, t, Model(), Data())
    config = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 8, "train_batch_size": 16}

    class Best:
        name = "z1_mb8_gas1"

        def metric(self, m):
            return 100.0

    write_cache(
        job,
        TuningResult(metric="throughput", trials=[], best=Best(), best_config=config, results_dir=tmp_path / "gone"),
    )
    t.strategy.tuning.resolve(t.strategy, t, Model(), Data(), None, can_tune=False, required=True)
    assert t.strategy.tuned_config == config and t.strategy.tuning_result is None  # trials folder is gone


def test_a_given_tuned_config_trains_as_is(tmp_path):
    config = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 8, "train_batch_size": 16}
    for autotune in (True, False):
        strategy = AutotuneDeepSpeedStrategy(config=config, cache_dir=tmp_path, autotune=autotune)
        assert strategy.tuned_config == config and not strategy.tuning.active()


def test_autotune_can_be_switched_off(tmp_path, monkeypatch):
    assert not AutotuneDeepSpeedStrategy(autotune=False).tuning.active()
    monkeypatch.setenv("ZEROTUNE_AUTOTUNE", "0")
    assert not AutotuneDeepSpeedStrategy().tuning.active()
    monkeypatch.setenv("ZEROTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("ZEROTUNE_PROBE", "/x/probe.json")  # inside a trial: the probe sets the config
    assert not AutotuneDeepSpeedStrategy().tuning.active()
    with pytest.raises(ConfigError, match="metric"):
        AutotuneDeepSpeedStrategy(metric="speed")


def test_retune_tunes_again_despite_a_cached_result(tmp_path, monkeypatch):
    from zerotune.lightning._tuning import Tuning

    config = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 8, "train_batch_size": 16}
    tuned = []

    def fake_tune(self, job):  # stands in for the trials: writes what a tuning writes
        tuned.append(job.fingerprint)
        (Path(job.cache_dir) / job.fingerprint).mkdir(parents=True, exist_ok=True)
        (Path(job.cache_dir) / job.fingerprint / "tuned.json").write_text(
            json.dumps({"best": f"run{len(tuned)}", "config": config, "results_dir": str(tmp_path / "none")})
        )

    monkeypatch.setattr(Tuning, "_tune", fake_tune)
    for retune, expect in ((False, 1), (False, 1), (True, 2)):
        t = trainer(tmp_path, retune=retune)
        t.strategy.tuning.resolve(t.strategy, t, Model(), Data(), None, can_tune=True, required=True)
        assert len(tuned) == expect and t.strategy.tuning.entry["best"] == f"run{expect}"


@pytest.mark.parametrize(
    "option, value",
    [("retune", "no"), ("autotune", "false"), ("max_trials", 2.5), ("global_batch", "64"), ("trial_timeout", "30")],
)
def test_strategy_options_of_the_wrong_type_are_named(option, value):
    with pytest.raises(ConfigError, match=f"{option}=") as info:
        AutotuneDeepSpeedStrategy(**{option: value})
    assert isinstance(info.value, ValueError)


def test_strategy_measurement_options_are_the_api_s_and_checked_at_once():
    strategy = AutotuneDeepSpeedStrategy(precision=0.05, max_measure_seconds=6.0, stall_timeout=60.0, max_steps=30)
    assert strategy.tuning.measure == {
        "precision": 0.05,
        "max_measure_seconds": 6.0,
        "stall_timeout": 60.0,
        "max_steps": 30,
    }
    with pytest.raises(ConfigError, match="precision"):
        AutotuneDeepSpeedStrategy(precision=2.0)
