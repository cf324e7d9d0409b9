"""Knob search with real DeepSpeed trials on CPU (arg_mappings: test_hf_cpu.py)."""

import json

import pytest

from conftest import ROOT
from zerotune import Autotuner
from zerotune.trials._trial import TrialState

pytestmark = pytest.mark.integration


def test_fast_false_runs_a_knob_search_with_real_deepspeed(tmp_path):
    cfg = {
        "train_micro_batch_size_per_gpu": [8],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2, "overlap_comm": [True, False]},
        "autotuning": {
            "max_train_batch_size": 32,
            "start_profile_step": 2,
            "end_profile_step": 5,
            "tuner_type": "model_based",
            "tuner_early_stopping": 2,
        },
    }
    tuner = Autotuner(
        [str(ROOT / "examples" / "gpt.py"), "--model", "tiny"],
        cfg,
        num_gpus=2,
        results_dir=tmp_path / "results",
        precision=0.1,
    )
    result = tuner.tune()
    knob_trials = [t for t in result.trials if t.spec.overrides]
    assert knob_trials and all(t.state is TrialState.OK for t in knob_trials)
    for t in knob_trials:  # DeepSpeed ran what the trial asked for
        zero = json.loads((tmp_path / "results" / t.name / "ds_config.json").read_text())["zero_optimization"]
        assert zero["overlap_comm"] == dict(t.spec.overrides)["zero_optimization.overlap_comm"]
    assert any("with model_based" in n for n in result.notes)
