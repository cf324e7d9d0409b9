"""In-Python entry points: what trial processes can import, and what they cannot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import zerotune.targets._entry
from zerotune import Autotuner, ConfigError
from zerotune.targets._command import UserCommand
from zerotune.targets._entry import entry_args, load, target_of


def top_level(cfg):
    return cfg


def test_module_function_gets_its_import_root():
    args = entry_args(top_level)
    assert args[:2] == [f"{__name__}:top_level", "--path"]
    assert Path(args[2], *__name__.split(".")).with_suffix(".py") == Path(__file__).resolve()


def test_lambda_and_nested_functions_are_refused():
    def nested(cfg):
        pass

    with pytest.raises(ConfigError, match="top level of a module"):
        target_of(lambda cfg: None)
    with pytest.raises(ConfigError, match="top level of a module"):
        target_of(nested)


def test_file_target_loads_without_running_the_main_guard(tmp_path):
    f = tmp_path / "job.py"
    f.write_text("def train(cfg):\n    return cfg['x']\nif __name__ == '__main__':\n    raise SystemExit('ran')\n")
    assert load(f"{f}:train")({"x": 3}) == 3


def test_entry_script_calls_the_function_with_the_config(tmp_path):
    (tmp_path / "jobmod.py").write_text("import json, sys\ndef train(cfg):\n    print(json.dumps(cfg))\n")
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4}))
    cmd = UserCommand(zerotune.targets._entry.__file__, ("jobmod:train", "--path", str(tmp_path)))
    out = subprocess.run(
        [sys.executable, cmd.script, *cmd.trial_args(str(cfg)), "--local_rank=1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == {"train_micro_batch_size_per_gpu": 4}


def test_autotuner_accepts_a_function(tmp_path, gpu_node):
    from fakes import FakeLauncher

    launcher = FakeLauncher()
    tuner = Autotuner(
        top_level,
        {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 4},
        num_gpus=2,
        memory_per_device="8GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=gpu_node,
    )
    result = tuner.tune()
    job = launcher.jobs[0]
    assert job.script.endswith("entry.py") and job.script_args[0] == f"{__name__}:top_level"
    assert job.script_args[-2] == "--deepspeed_config" and not job.local_rank_arg
    value, ci = result.best_metric
    assert value > 0 and ci >= 0
