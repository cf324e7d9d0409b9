"""Hugging Face Trainer scripts, tuned unmodified (fake launcher): the batch options are mapped
by themselves, the global batch is the command's, and trial configs keep the user's "auto"."""

import json
import shlex

import pytest

from fakes import FakeLauncher
from zerotune import Autotuner
from zerotune.targets._hf_trainer import HfTrainerTarget, looks_like_hf_trainer

TRAINER_SCRIPT = """
from transformers import HfArgumentParser, Trainer, TrainingArguments

args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
"""


@pytest.fixture
def hf_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINER_SCRIPT)
    return script


def hf_config(tmp_path, **extra):
    cfg = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "zero_optimization": {"stage": [1, 2]},
        **extra,
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return path


def test_detection_reads_the_source(tmp_path, hf_script):
    assert looks_like_hf_trainer(str(hf_script))
    plain = tmp_path / "plain.py"
    plain.write_text("import deepspeed\n# TrainingArguments in a comment of a script without transformers\n")
    assert not looks_like_hf_trainer(str(plain))


def test_a_trainer_script_is_tuned_through_its_own_options(tmp_path, hf_script, gpu_node):
    launcher = FakeLauncher()
    cmd = [
        str(hf_script),
        "--deepspeed",
        str(hf_config(tmp_path)),
        "--output_dir",
        "out",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "4",
    ]
    tuner = Autotuner(
        cmd, num_gpus=2, memory_per_device="6GiB", results_dir=tmp_path / "r", launcher=launcher, node=gpu_node
    )
    assert isinstance(tuner.target, HfTrainerTarget)
    assert tuner.request.global_batch == 8 * 4 * 2  # the command's global batch is held
    result = tuner.tune()
    assert launcher.jobs
    for job in launcher.jobs:
        args = job.script_args
        mb = int(args[args.index("--per_device_train_batch_size") + 1])
        gas = int(args[args.index("--gradient_accumulation_steps") + 1])
        assert (mb, gas) == (job.spec.micro_batch, job.spec.grad_accum) and mb * gas * 2 == 64
        assert args.count("--per_device_train_batch_size") == 1  # replaced, not added twice
        # The trial config keeps "auto" where the user had it: the Trainer fills it.
        assert {
            k: job.config[k]
            for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
        } == dict.fromkeys(
            ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"), "auto"
        )
    optimal = json.loads((tmp_path / "r" / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == "auto" and optimal["train_batch_size"] == "auto"
    assert optimal["zero_optimization"]["stage"] == result.best.spec.stage
    words = shlex.split((tmp_path / "r" / "cmd_optimal.txt").read_text())
    assert words[words.index("--per_device_train_batch_size") + 1] == str(result.best.spec.micro_batch)
    assert words[words.index("--gradient_accumulation_steps") + 1] == str(result.best.spec.grad_accum)
    assert words[words.index("--deepspeed") + 1].endswith("ds_config_optimal.json")
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert (
        "note: a Hugging Face Trainer script: each trial sets its batch through the script's options "
        "(micro-batch --per_device_train_batch_size, accumulation --gradient_accumulation_steps); "
        "global batch 64 held"
    ) in summary


def test_trainer_defaults_and_left_out_keys(tmp_path, hf_script, gpu_node):
    """No batch options in the command: TrainingArguments' defaults (8, 1) set the global batch.
    A train_batch_size the user left out is never added to a trial config."""
    cfg = hf_config(tmp_path)
    data = json.loads(cfg.read_text())
    del data["train_batch_size"]
    cfg.write_text(json.dumps(data))
    launcher = FakeLauncher()
    tuner = Autotuner(
        [str(hf_script), "--deepspeed", str(cfg)],
        num_gpus=2,
        memory_per_device="6GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=gpu_node,
    )
    assert tuner.request.global_batch == 16
    tuner.tune()
    assert launcher.jobs and all("train_batch_size" not in job.config for job in launcher.jobs)


def test_explicit_arg_mappings_win(tmp_path, hf_script, gpu_node):
    cfg = hf_config(
        tmp_path, autotuning={"arg_mappings": {"train_micro_batch_size_per_gpu": "--mb"}, "max_train_batch_size": 32}
    )
    launcher = FakeLauncher()
    tuner = Autotuner(
        [str(hf_script), "--deepspeed", str(cfg)],
        num_gpus=2,
        memory_per_device="6GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=gpu_node,
    )
    assert tuner.arg_mappings == {
        "train_micro_batch_size_per_gpu": "--mb",
        "gradient_accumulation_steps": "--gradient_accumulation_steps",
    }
    assert tuner.request.global_batch == 32
    tuner.tune()
    job = launcher.jobs[0]
    assert "--mb" in job.script_args and "--per_device_train_batch_size" not in job.script_args


def test_an_absurd_batch_option_is_one_clear_error(tmp_path, hf_script, gpu_node):
    from zerotune._errors import ConfigError

    with pytest.raises(ConfigError, match="beyond any real job"):
        Autotuner(
            [str(hf_script), "--deepspeed", str(hf_config(tmp_path)), "--per_device_train_batch_size", "99999999999"],
            num_gpus=2,
            results_dir=tmp_path / "r",
            launcher=FakeLauncher(),
            node=gpu_node,
        )
    assert not (tmp_path / "r").exists()
