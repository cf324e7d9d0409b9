"""A production ds_config, tuned as it is with real DeepSpeed trials on CPU (2 processes, gloo):
no autotuning section, an int stage and micro-batch, the global batch. The user's config is the
first trial and a row of its own; the summary gives the speed-up over it and the payback."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration
GPT = ROOT / "examples" / "gpt.py"


def test_a_production_config_is_tuned_with_no_edit(tmp_path):
    prod = {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 1},
    }
    (tmp_path / "prod.json").write_text(json.dumps(prod))
    res = tmp_path / "results"
    cmd = [sys.executable, "-m", "zerotune", "tune", "--num-gpus", "2", "--results-dir", str(res),
           "--precision", "0.1", str(GPT), "--model", "tiny", "--deepspeed_config", str(tmp_path / "prod.json")]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((res / "results.json").read_text())
    assert results["trials"][0]["name"] == "z1_mb2_gas4" == results["own"]["name"]
    assert results["trials"][0]["state"] == "ok" and len({t["spec"]["stage"] for t in results["trials"]}) > 1
    summary = (res / "summary.txt").read_text()
    assert "your config: z1_mb2_gas4" in summary
    own = results["own"]
    assert own["chosen"] or own["fastest"] or (own["speedup"] and own["low"] and own["payback_steps"])
    if not (own["chosen"] or own["fastest"]):
        assert "payback: after" in summary and "(95%: " in summary
    optimal = json.loads((res / "ds_config_optimal.json").read_text())
    assert optimal["train_batch_size"] == 16 and optimal["gradient_clipping"] == 1.0
