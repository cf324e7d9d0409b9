"""Knob search and arg_mappings with real DeepSpeed trials on CPU."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from zerotune import Autotuner
from zerotune.trial import TrialState

pytestmark = pytest.mark.integration
ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}


def test_hugging_face_style_script_is_tuned_through_arg_mappings_and_trained(tmp_path):
    cfg = json.loads((ROOT / "examples" / "ds_config_hf.json").read_text())
    cfg["zero_optimization"]["stage"] = 0
    # One trial: the mapping is the point here, not the search.
    cfg["autotuning"].update({"max_train_batch_size": 32, "min_train_micro_batch_size_per_gpu": 8,
                              "max_train_micro_batch_size_per_gpu": 8})
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    res = tmp_path / "results"
    cmd = [sys.executable, "-m", "zerotune.cli", "run", "--num-gpus", "2", "--results-dir", str(res),
           "--precision", "0.1", str(ROOT / "examples" / "hf_style.py"), "--model", "tiny", "--max_steps", "20",
           "--deepspeed", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((res / "results.json").read_text())
    ok = [t for t in results["trials"] if t["state"] == "ok"]
    assert [t["spec"]["micro_batch"] for t in ok] == [8]
    for t in ok:  # each trial's script got its micro-batch as an argument; "auto" stayed in its config
        mb, gas = t["spec"]["micro_batch"], t["spec"]["grad_accum"]
        trial_dir = next(d for d in res.iterdir() if d.is_dir() and d.name.startswith(f"z0_mb{mb}_"))
        probe = json.loads((trial_dir / "probe.json").read_text())
        args = probe["args"]
        assert args[args.index("--per_device_train_batch_size") + 1] == str(mb)
        assert args[args.index("--gradient_accumulation_steps") + 1] == str(gas)
        assert json.loads((trial_dir / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"] == "auto"
    optimal = json.loads((res / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == "auto"
    assert "--per_device_train_batch_size" in (res / "cmd_optimal.txt").read_text()
    assert "step 20 loss" in out.stdout  # trained with the tuned arguments


def test_fast_false_runs_a_knob_search_with_real_deepspeed(tmp_path):
    cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "overlap_comm": [True, False]},
           "autotuning": {"max_train_batch_size": 32, "start_profile_step": 2, "end_profile_step": 5,
                          "tuner_type": "model_based", "tuner_early_stopping": 2}}
    tuner = Autotuner([str(ROOT / "examples" / "gpt.py"), "--model", "tiny"], cfg, num_gpus=2,
                      results_dir=tmp_path / "results", precision=0.1)
    result = tuner.tune()
    knob_trials = [t for t in result.trials if t.spec.overrides]
    assert knob_trials and all(t.state is TrialState.OK for t in knob_trials)
    for t in knob_trials:  # DeepSpeed ran what the trial asked for
        zero = json.loads((tmp_path / "results" / t.name / "ds_config.json").read_text())["zero_optimization"]
        assert zero["overlap_comm"] == dict(t.spec.overrides)["zero_optimization.overlap_comm"]
    assert any("with model_based" in n for n in result.notes)
