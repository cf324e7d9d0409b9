"""Real FSDP2 trials on CPU beside real DeepSpeed ones: the Hugging Face Trainer and the Accelerate
examples tuned unmodified across both engines, their losses compared, and the command written for
an FSDP2 choice trained as written."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration
pytest.importorskip("transformers", reason="the [hf] extra (transformers, accelerate) is not installed")
ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}
MODEL = ["--n_layer", "2", "--n_embd", "64", "--n_head", "2", "--vocab_size", "512", "--seq_len", "64"]


def tune(args: list[str], tmp_path, res, *, cwd=None, verb="tune"):
    cmd = [sys.executable, "-m", "zerotune.cli", verb, "--results-dir", str(res), "--precision", "0.1", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900, cwd=cwd or tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((res / "results.json").read_text()), (res / "summary.txt").read_text(), out.stdout


def trainer_setup(tmp_path) -> list[str]:
    """The Trainer example at one micro-batch (4) and stage 1: its arguments after the script."""
    config = json.loads((ROOT / "examples" / "ds_config_hf_trainer.json").read_text())
    config["autotuning"].update(min_train_micro_batch_size_per_gpu=4, max_train_micro_batch_size_per_gpu=4)
    config["zero_optimization"]["stage"] = 1
    (tmp_path / "ds.json").write_text(json.dumps(config))
    return ["--deepspeed", "ds.json", "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "4",
            "--gradient_accumulation_steps", "2", "--max_steps", "30", "--save_strategy", "no",
            "--report_to", "none", "--disable_tqdm", "true", *MODEL]  # fmt: skip


def test_trainer_script_tuned_across_deepspeed_and_fsdp2(tmp_path):
    train = trainer_setup(tmp_path)
    res = tmp_path / "results"
    results, summary, _ = tune(
        ["--num-gpus", "2", "--engines", "deepspeed,fsdp", str(ROOT / "examples" / "hf_trainer.py"), *train],
        tmp_path, res,
    )  # fmt: skip
    ok = {t["name"]: t for t in results["trials"] if t["state"] == "ok"}
    assert {"z1_mb4_gas2", "fsdp-keep_mb4_gas2"} <= set(ok), results["trials"]
    fsdp = ok["fsdp-keep_mb4_gas2"]
    assert fsdp["measurement"]["samples_per_step"] == 16 and len(fsdp["losses"]) >= 3
    # Real FSDP2: the Trainer got the trial's FSDP config, and the ranks shared the batch between them.
    args = json.loads((res / "fsdp-keep_mb4_gas2" / "probe.json").read_text())["args"]
    assert "--deepspeed" not in args and args[-3:-1] == ["--fsdp", "--fsdp_config"]
    assert "engines: the first" in summary and "losses agree within 0.0001" in summary
    lines = [x for x in summary.splitlines() if x.startswith("engine ")]
    assert len(lines) == 2 and all("master fp32, compute fp32, reduce fp32" in x for x in lines)


def test_accelerate_script_tuned_to_fsdp2_and_its_command_trains(tmp_path):
    yaml = pytest.importorskip("yaml")
    acc = yaml.safe_load((ROOT / "examples" / "accelerate_deepspeed.yaml").read_text())
    acc["deepspeed_config"]["deepspeed_config_file"] = str(ROOT / "examples" / "ds_config_accelerate.json")
    (tmp_path / "acc.yaml").write_text(yaml.safe_dump(acc))
    res = tmp_path / "results"
    script = [str(ROOT / "examples" / "accelerate_train.py"), "--model", "tiny", "--per_device_train_batch_size", "4",
              "--gradient_accumulation_steps", "2", "--max_train_steps", "30"]  # fmt: skip
    results, summary, _ = tune(
        ["--engines", "fsdp", "--fsdp-wrap", "Block", "accelerate", "launch", "--config_file", "acc.yaml", *script],
        tmp_path,
        res,
    )
    best = next(t for t in results["trials"] if t["name"] == results["best"])
    assert best["spec"]["engine"] == "fsdp" and all(t["spec"].get("engine") == "fsdp" for t in results["trials"])
    optimal = yaml.safe_load((res / "accelerate_config_optimal.yaml").read_text())
    assert (
        optimal["distributed_type"] == "FSDP"
        and optimal["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Block"
    )
    line = (res / "cmd_optimal.txt").read_text()
    words = shlex.split(line)
    assert words[words.index("--config_file") + 1] == str(res / "accelerate_config_optimal.yaml")
    again = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "steps=30 engine=FSDP" in again.stdout  # trained with FSDP2, as written


def test_zerotune_run_trains_a_trainer_script_with_fsdp2(tmp_path):
    res = tmp_path / "results"
    results, _, printed = tune(
        ["--num-gpus", "2", "--engines", "fsdp", str(ROOT / "examples" / "hf_trainer.py"), *trainer_setup(tmp_path)],
        tmp_path,
        res,
        verb="run",
    )
    assert results["best"].startswith("fsdp-")
    assert "steps=30 zero_stage=None" in printed  # the Trainer trained to its end, without DeepSpeed
    line = (res / "cmd_optimal.txt").read_text()
    words = shlex.split(line)
    assert words[words.index("--fsdp_config") + 1] == str(res / "fsdp_config_optimal.json")
    again = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=ENV, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "steps=30 zero_stage=None" in again.stdout  # cmd_optimal.txt, as written, trains with FSDP2
