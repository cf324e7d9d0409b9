"""A Lightning script as a tuning target, with a fake launcher: config forms, the tuner's Lightning
mode, the cache."""

import json

import pytest

from fakes import FakeLauncher, FakeMachine
from zerotune import Autotuner, ConfigError
from zerotune.targets._command import UserCommand
from zerotune.targets._lightning_program import (
    LightningJob,
    LightningTarget,
    is_tuned_config,
    lightning_form,
    looks_like_lightning,
    read_cache,
    trainer_settings,
)
from zerotune.trials._trial import TrialSpec

BASE = {"zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 2, "overlap_comm": True}}


def job(**kw):
    args = dict(
        strategy="AutotuneDeepSpeedStrategy",
        deepspeed=True,
        world_size=2,
        batch_size=8,
        batch_size_attr="datamodule",
        accumulate_grad_batches=2,
        base_config=BASE,
    )
    return LightningJob(**{**args, **kw})


def test_tuning_config_keeps_the_global_batch_and_searches_every_stage():
    cfg = job().tuning_config()
    assert cfg["autotuning"]["max_train_batch_size"] == 8 * 2 * 2
    assert cfg["zero_optimization"] == {"stage": "all", "overlap_comm": True}  # Lightning's default 2 is no choice
    assert not {"gradient_accumulation_steps", "train_batch_size", "train_micro_batch_size_per_gpu"} & set(cfg)


def test_tuning_config_honours_the_strategy_and_user_choices():
    cfg = job(stages=[1, 3], autotuning={"metric": "latency", "max_train_batch_size": 64}).tuning_config()
    assert cfg["zero_optimization"]["stage"] == [1, 3]
    assert cfg["autotuning"] == {"metric": "latency", "max_train_batch_size": 64}
    listed = job(base_config={"zero_optimization": {"stage": [0, 1]}}).tuning_config()
    assert listed["zero_optimization"]["stage"] == [0, 1]


def test_without_a_batch_size_attribute_the_micro_batch_stays_fixed():
    cfg = job(batch_size_attr=None, batch_size=4).tuning_config()
    assert cfg["train_micro_batch_size_per_gpu"] == 4


def test_lightning_form_and_trainer_settings():
    tuned = {
        "zero_optimization": {"stage": 3},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 4,
        "train_batch_size": 32,
    }
    form = lightning_form(tuned)
    assert "gradient_accumulation_steps" not in form and form["train_batch_size"] == 32  # Lightning issue 12299
    assert trainer_settings(form, world_size=2) == (4, 4)
    assert trainer_settings(tuned, world_size=2) == (4, 4)
    assert is_tuned_config(form) and not is_tuned_config({**form, "zero_optimization": {"stage": "all"}})
    with pytest.raises(ConfigError, match="not micro-batch 4"):
        trainer_settings({**form, "train_batch_size": 30}, world_size=2)


def test_looks_like_lightning(tmp_path):
    (tmp_path / "a.py").write_text("import lightning as L\n")
    (tmp_path / "b.py").write_text("from pytorch_lightning import Trainer\n")
    (tmp_path / "c.py").write_text("import deepspeed  # not lightning\n")
    assert looks_like_lightning(tmp_path / "a.py") and looks_like_lightning(tmp_path / "b.py")
    assert not looks_like_lightning(tmp_path / "c.py")


@pytest.fixture
def lightning_tuner(tmp_path, gpu_node):
    script = tmp_path / "train_lightning.py"
    script.write_text("import lightning\n")

    def make(**kw):
        j = job(fingerprint="abc123", cache_dir=str(tmp_path / "cache"), **kw.pop("job", {}))
        launcher = FakeLauncher(FakeMachine())
        command = [str(script), "--epochs", "3"]
        tuner = Autotuner(
            command,
            num_gpus=kw.pop("num_gpus", None),
            target=LightningTarget(command=UserCommand.parse(command), job=j),
            memory_per_device="8GiB",
            launcher=launcher,
            node=gpu_node,
            results_dir=tmp_path / "results",
            **kw,
        )
        tuner.fake = launcher
        return tuner

    return make


def test_lightning_trials_get_the_config_through_the_probe_not_the_arguments(lightning_tuner, tmp_path):
    tuner = lightning_tuner()
    result = tuner.tune()
    assert tuner.num_gpus == 2  # the Trainer's devices
    assert all(
        j.probe_spec(j.trial_dir)["lightning_config"] == str((j.trial_dir / "ds_config.json").resolve())
        and j.script_args == ["--epochs", "3"]
        for j in tuner.fake.jobs
    )
    assert result.best_config["train_batch_size"] == 32
    assert {s for s in (j.spec.stage for j in tuner.fake.jobs)} == {0, 1, 2}  # stage 3: stage 2 fits all
    written = json.loads((tmp_path / "results" / "ds_config_optimal.json").read_text())
    assert "gradient_accumulation_steps" not in written and "autotuning" not in written
    cmd = (tmp_path / "results" / "cmd_optimal.txt").read_text()
    assert cmd.startswith("PL_DEEPSPEED_CONFIG_PATH=") and "--deepspeed_config" not in cmd and "--epochs 3" in cmd
    entry = read_cache(tmp_path / "cache", "abc123")  # a later run of the strategy finds it
    assert entry["best"] == result.best.name and entry["config"] == written
    assert (entry["batch_size"], entry["accumulate_grad_batches"]) == trainer_settings(written, 2)


def test_lightnings_own_strategy_is_told_to_set_the_batch_itself(lightning_tuner, tmp_path):
    lightning_tuner(job={"strategy": "DeepSpeedStrategy"}).tune()
    cmd = (tmp_path / "results" / "cmd_optimal.txt").read_text()
    assert cmd.startswith("# DeepSpeedStrategy") and "accumulate_grad_batches=" in cmd


def test_process_count_must_match_the_trainer(lightning_tuner):
    with pytest.raises(ConfigError, match="--num-gpus 4 does not match the Trainer's devices=2"):
        lightning_tuner(num_gpus=4)
    with pytest.raises(ConfigError, match="one node"):
        lightning_tuner(job={"num_nodes": 2, "world_size": 4})


def test_the_programs_untuned_config_is_the_payback_baseline(lightning_tuner):
    tuner = lightning_tuner()
    assert tuner.trials.own_spec == TrialSpec(stage=2, micro_batch=8, grad_accum=2)  # Lightning's stage, its batch
    result = tuner.tune()
    assert result.own is not None and result.own.name == tuner.trials.own_spec.name
    assert tuner.fake.jobs[0].spec == tuner.trials.own_spec  # measured first
