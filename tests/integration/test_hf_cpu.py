"""A real Hugging Face Trainer script (examples/hf_trainer.py), tuned unmodified on CPU with real
DeepSpeed trials, then trained with `zerotune run` and with cmd_optimal.txt as written."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration
pytest.importorskip("transformers", reason="the [hf] extra (transformers, accelerate) is not installed")
ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}  # conftest put this venv's bin (accelerate, deepspeed) first on PATH
BATCH = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
# A small GPT-2 so that two stages tune in about a minute; the command is the README's otherwise.
MODEL = ["--n_layer", "2", "--n_embd", "64", "--n_head", "2", "--vocab_size", "512", "--seq_len", "64"]


def run_two_stages(zerotune_args: list[str], tmp_path: Path, res: Path):
    """`zerotune run ...` in ``tmp_path``: its output, and the results.json of a tuning whose OK
    trials covered stages 1 and 2."""
    cmd = [sys.executable, "-m", "zerotune.cli", "run", "--results-dir", str(res), "--precision", "0.1", *zerotune_args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((res / "results.json").read_text())
    ok = [t for t in results["trials"] if t["state"] == "ok"]
    assert {t["spec"]["stage"] for t in ok} == {1, 2}, results["trials"]
    return out, results, ok


def test_trainer_script_tuned_over_two_stages_then_trained(tmp_path):
    res = tmp_path / "results"
    train = [
        "--output_dir",
        str(tmp_path / "out"),
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--max_steps",
        "30",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        *MODEL,
    ]
    # The example's config, one micro-batch per stage to keep the test short.
    config = json.loads((ROOT / "examples" / "ds_config_hf_trainer.json").read_text())
    config["autotuning"].update(min_train_micro_batch_size_per_gpu=4, max_train_micro_batch_size_per_gpu=4)
    (tmp_path / "ds.json").write_text(json.dumps(config))
    out, results, ok = run_two_stages(
        ["--num-gpus", "2", str(ROOT / "examples" / "hf_trainer.py"), "--deepspeed", "ds.json", *train], tmp_path, res
    )
    for t in ok:
        spec, trial_dir = t["spec"], res / t["name"]
        assert spec["micro_batch"] * spec["grad_accum"] * 2 == 16  # the command's global batch (4 x 2 x 2)
        args = json.loads((trial_dir / "probe.json").read_text())["args"]
        assert args[args.index("--per_device_train_batch_size") + 1] == str(spec["micro_batch"])
        assert args[args.index("--gradient_accumulation_steps") + 1] == str(spec["grad_accum"])
        config = json.loads((trial_dir / "ds_config.json").read_text())
        # No key the Trainer fills was added: the user left train_batch_size out, "auto" stays.
        assert "train_batch_size" not in config
        assert config["train_micro_batch_size_per_gpu"] == config["gradient_accumulation_steps"] == "auto"
    optimal = json.loads((res / "ds_config_optimal.json").read_text())
    assert [optimal.get(k) for k in BATCH] == ["auto", "auto", None]
    best = next(t for t in results["trials"] if t["name"] == results["best"])
    assert optimal["zero_optimization"]["stage"] == best["spec"]["stage"]
    assert f"steps=30 zero_stage={best['spec']['stage']}" in out.stdout  # `zerotune run` trained to the end

    # cmd_optimal.txt, run as written by a shell, trains with the chosen arguments and config.
    line = (res / "cmd_optimal.txt").read_text()
    words = shlex.split(line)
    assert words[words.index("--per_device_train_batch_size") + 1] == str(best["spec"]["micro_batch"])
    again = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"steps=30 zero_stage={best['spec']['stage']}" in again.stdout  # the engine's own stage


def test_accelerate_script_tuned_over_two_stages_then_trained(tmp_path):
    """`zerotune run accelerate launch --config_file acc.yaml train.py ...` on CPU, warm trials;
    then the written `accelerate launch` command, run as written, trains with the choice."""
    yaml = pytest.importorskip("yaml")
    config = json.loads((ROOT / "examples" / "ds_config_accelerate.json").read_text())
    config["zero_optimization"]["stage"] = [1, 2]
    config["autotuning"].update(min_train_micro_batch_size_per_gpu=4, max_train_micro_batch_size_per_gpu=4)
    (tmp_path / "ds.json").write_text(json.dumps(config))
    acc = yaml.safe_load((ROOT / "examples" / "accelerate_deepspeed.yaml").read_text())
    acc["deepspeed_config"]["deepspeed_config_file"] = "ds.json"
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    res = tmp_path / "results"
    script = [
        str(ROOT / "examples" / "accelerate_train.py"),
        "--model",
        "tiny",
        "--per_device_train_batch_size",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--max_train_steps",
        "30",
    ]
    out, results, ok = run_two_stages(["accelerate", "launch", "--config_file", "acc.yaml", *script], tmp_path, res)
    for t in ok:
        cmd_txt = (res / t["name"] / "cmd.txt").read_text()
        assert "accelerate.commands.launch" in cmd_txt and "--config_file" in cmd_txt
    summary = (res / "summary.txt").read_text()
    assert "1 launch(es)" in summary  # the second stage ran warm in the processes of the first
    best = next(t for t in results["trials"] if t["name"] == results["best"])
    stage = best["spec"]["stage"]
    assert f"steps=30 engine=deepspeed zero_stage={stage} micro_batch=4 accumulation=2" in out.stdout  # `zerotune run`
    optimal = yaml.safe_load((res / "accelerate_config_optimal.yaml").read_text())
    assert optimal["deepspeed_config"]["deepspeed_config_file"] == str(res / "ds_config_optimal.json")

    line = (res / "cmd_optimal.txt").read_text()
    words = shlex.split(line)
    env_words = [w for w in words if "=" in w.split("/")[0] and w.split("=")[0].isupper()]
    assert [w.split("=")[0] for w in env_words] == [
        "DS_ACCELERATOR",
        "OMP_NUM_THREADS",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
    ]  # the trials' environment
    assert words[len(env_words) : len(env_words) + 2] == ["accelerate", "launch"]
    again = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"steps=30 engine=deepspeed zero_stage={stage} micro_batch=4 accumulation=2" in again.stdout
