"""Every feature of Lightning's DeepSpeed strategy, through AutotuneDeepSpeedStrategy on CPU."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytestmark = pytest.mark.integration
JOB = Path(__file__).with_name("lightning_features.py")


BATCH = [
    "stage:1",
    "stage:2",
    "by_name",
    "offload_optimizer",
    "config_dict",
    "config_path",
    "config_env",
    "precision:32-true",
    "precision:16-mixed",
    "precision:bf16-mixed",
    "precision:bf16-true",
    "clip:norm",
    "validate_predict",
    # ZeRO-3 last: it is the stage that changes most in a process.
    "stage:3",
    "offload_parameters",
    "checkpoint",
    "sharded_init",
]
"""Scenarios that train: one launch runs them all, each in a fresh Trainer (a launch per
scenario cost most of this file's time). The ones that must fail run alone (see run)."""


def launch(scenarios, work, ok=True):
    # The features themselves, without tuning (test_lightning_tuning.py covers that).
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "ZEROTUNE_AUTOTUNE": "0"}
    env.pop("PL_DEEPSPEED_CONFIG_PATH", None)
    out = subprocess.run(
        [sys.executable, str(JOB), ",".join(scenarios), str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=work,
    )
    if ok:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    work = tmp_path_factory.mktemp("lightning_features")
    scenarios = [s for s in BATCH if s != "precision:16-mixed" or cpu_has_fp16()]
    launch(scenarios, work)
    return work


def ranks_of(work: Path):
    errors = sorted(work.glob("rank*.error"))
    assert not errors, first_failure(work) + "\n".join(p.read_text()[-3000:] for p in errors)
    ranks = [json.loads(p.read_text()) for p in work.glob("rank*.json")]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    return sorted(ranks, key=lambda r: r["rank"])


def first_failure(work: Path) -> str:
    """Once one rank fails a scenario, the ranks' collectives no longer match and every later
    scenario fails too: name the first one, with its error, so that a log shows the cause."""
    for scenario in BATCH:
        folder = work.parent / scenario.replace(":", "_")
        if folder == work:
            return ""
        errors = sorted(folder.glob("rank*.error"))
        if errors:
            return (
                f"first failed scenario: {scenario}\n"
                + "\n".join(p.read_text()[-3000:] for p in errors)
                + "\n--- this scenario:\n"
            )
    return ""


@pytest.fixture
def run(batch):
    def result(scenario, tmp_path, ok=True):
        if ok:
            return ranks_of(batch / scenario.replace(":", "_"))
        out = launch([scenario], tmp_path, ok=False)  # an error of its own: alone, so it ends the processes
        assert out.returncode != 0
        return out.stderr

    return result


def cpu_has_fp16() -> bool:
    """DeepSpeed's CPU accelerator allows fp16 only where oneDNN has fp16 kernels for this CPU."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:
        return False


def learned(ranks):
    return all(math.isfinite(r["loss"]) and r["loss"] < 8.0 for r in ranks)  # target variance is 16


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trains_on_cpu_with_each_zero_stage(tmp_path, stage, run):
    ranks = run(f"stage:{stage}", tmp_path)
    assert all(r["stage"] == stage and r["device"] == "cpu" for r in ranks) and learned(ranks)


def test_registered_by_name(tmp_path, run):
    ranks = run("by_name", tmp_path)
    assert {r["strategy"] for r in ranks} == {"AutotuneDeepSpeedStrategy"}
    assert all(r["stage"] == 2 for r in ranks)  # Lightning's DeepSpeedStrategy default


@pytest.mark.parametrize("scenario, key", [("offload_optimizer", "offload"), ("offload_parameters", "offload")])
def test_offload_to_cpu(tmp_path, scenario, key, run):
    ranks = run(scenario, tmp_path)
    assert all(r[key] == "cpu" for r in ranks) and learned(ranks)


@pytest.mark.parametrize("scenario", ["config_dict", "config_path", "config_env"])
def test_config_sources(tmp_path, scenario, run):
    ranks = run(scenario, tmp_path)
    assert all(r["stage"] == 1 for r in ranks) and learned(ranks)


@pytest.mark.parametrize(
    "precision, dtype",
    [
        ("32-true", "torch.float32"),
        ("16-mixed", "torch.float16"),
        ("bf16-mixed", "torch.bfloat16"),
        ("bf16-true", "torch.bfloat16"),
    ],
)
def test_precision(tmp_path, precision, dtype, run):
    if precision == "16-mixed" and not cpu_has_fp16():
        pytest.skip("this CPU has no fp16 kernels (oneDNN), so DeepSpeed refuses fp16 on it")
    ranks = run(f"precision:{precision}", tmp_path)
    assert all(r["dtype"] == dtype for r in ranks)
    assert all(math.isfinite(r["loss"]) for r in ranks)


def test_gradient_clipping_by_norm(tmp_path, run):
    ranks = run("clip:norm", tmp_path)
    assert all(r["clipping"] == 0.5 for r in ranks) and learned(ranks)


def test_gradient_clipping_by_value_is_a_clear_error(tmp_path, run):
    assert "clipping gradients by value" in run("clip:value", tmp_path, ok=False)


def test_checkpoint_resume_and_consolidation(tmp_path, run):
    ranks = run("checkpoint", tmp_path)
    r0 = ranks[0]
    assert r0["epoch"] == 2 and r0["global_step"] == 32  # 16 steps per epoch, resumed after the first
    assert r0["loss"] < r0["first_loss"]  # the loss continued from where it stopped
    assert r0["lr"] == pytest.approx(1e-2 * 0.5**6)  # the scheduler resumed too (32 steps / 5)
    assert r0["consolidated"] == 16 * 32 + 32 + 32 + 1


def test_zero3_sharded_initialisation(tmp_path, run):
    ranks = run("sharded_init", tmp_path)
    assert all(r["built_sharded"] for r in ranks)  # configure_model ran inside deepspeed.zero.Init
    assert all(r["ds_numel"] == 512 and r["local_numel"] < 512 for r in ranks)  # partitioned while training
    assert learned(ranks)


def test_validation_and_predict_loops(tmp_path, run):
    ranks = run("validate_predict", tmp_path)
    assert all(math.isfinite(r["val_loss"]) for r in ranks)
    assert sum(r["predictions"] for r in ranks) == 64


def test_two_optimizers_is_a_clear_error(tmp_path, run):
    assert "multiple optimizers is only supported with manual optimization" in run("two_optimizers", tmp_path, ok=False)


def test_bundled_lightning_example_trains(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "lightning_gpt.py"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    # 100 steps: after 30 the last batch's loss was still within noise of a uniform guess (flaky).
    out = subprocess.run(
        [sys.executable, str(example), "--model", "tiny", "--devices", "2", "--max-steps", "100", "--no-tune"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # Both ranks share stdout, where other output can run into the line: match the number only.
    loss = float(re.search(r"final loss (\d+\.\d{4})", out.stdout).group(1))
    assert loss < math.log(512) - 0.3  # clearly below a uniform guess over the tiny vocabulary (6.24)
