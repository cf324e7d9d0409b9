"""Tuning through Lightning for real (2 CPU processes): the strategy tunes on first fit and then
reads its cache; torchrun-started ranks use the cache or say what to do; the CLI tunes a Lightning
script unmodified and writes a config Lightning accepts."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_gpt.py"
# Global batch 2 x 2 processes: micro-batches 1 and 2 of one stage keep each tuning short.
ARGS = ["--model", "tiny", "--devices", "2", "--batch-size", "2", "--max-steps", "12", "--stage", "1"]


def env(**extra):
    e = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **extra}
    e.pop("PL_DEEPSPEED_CONFIG_PATH", None)
    return e


def run(argv, cwd, timeout=900, **extra):
    return subprocess.run(argv, capture_output=True, text=True, env=env(**extra), timeout=timeout, cwd=cwd)


def test_strategy_tunes_on_first_fit_then_trains_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = run([sys.executable, str(EXAMPLE), *ARGS, "--cache-dir", str(cache)], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "tuning DeepSpeed for this model" in first.stderr and "final loss" in first.stdout
    (entry_path,) = cache.glob("*/tuned.json")
    entry = json.loads(entry_path.read_text())
    assert "gradient_accumulation_steps" not in entry["config"] and entry["config"]["train_batch_size"] == 4
    assert f"training with {entry['best']} (batch_size={entry['batch_size']}" in first.stderr
    assert f"tuned: {entry['best']}" in first.stdout  # strategy.tuning_result
    trials = sorted(p.parent.name for p in entry_path.parent.glob("*/result.json"))
    assert trials and all(t.startswith("z1_") for t in trials)
    for t in trials:  # each trial ran with its own micro-batch and accumulation, checked on the engine
        result = json.loads((entry_path.parent / t / "result.json").read_text())["result"]
        assert result["state"] == "ok", result["reason"]

    again = run([sys.executable, str(EXAMPLE), *ARGS, "--cache-dir", str(cache)], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "using the tuned config" in again.stderr and "tuning DeepSpeed" not in again.stderr
    assert sorted(p.parent.name for p in entry_path.parent.glob("*/result.json")) == trials  # no new trial

    # Ranks started by torchrun cannot run trials, but find the cached result.
    tr = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            str(EXAMPLE),
            *ARGS,
            "--cache-dir",
            str(cache),
        ],
        tmp_path,
    )
    # gloo's threads can abort a rank as the interpreter exits after its last step ("terminate
    # called without an active exception"): the program's own teardown under torchrun, after the
    # training this test is about, which is judged by what it printed.
    trained = "final loss" in tr.stdout
    aborted_at_exit = "terminate called without an active exception" in tr.stderr
    assert tr.returncode == 0 or (trained and aborted_at_exit), tr.stderr[-3000:]
    assert trained and f"training with {entry['best']}" in tr.stderr


def test_torchrun_without_a_cached_result_says_what_to_do(tmp_path):
    tr = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            str(EXAMPLE),
            *ARGS,
            "--cache-dir",
            str(tmp_path / "empty"),
        ],
        tmp_path,
        timeout=300,
    )
    assert tr.returncode != 0
    assert "started outside Lightning" in tr.stderr and "zerotune tune --num-gpus 2" in tr.stderr


def test_cli_tunes_a_lightning_script_unmodified(tmp_path):
    results = tmp_path / "results"
    out = run(
        [
            sys.executable,
            "-m",
            "zerotune.cli",
            "tune",
            "--results-dir",
            str(results),
            str(EXAMPLE),
            *ARGS,
            "--no-tune",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert "gradient_accumulation_steps" not in optimal and optimal["zero_optimization"]["stage"] == 1
    assert optimal["train_batch_size"] == 4  # the script's batch_size 2 x 2 processes
    cmd = (results / "cmd_optimal.txt").read_text().strip()
    assert "PL_DEEPSPEED_CONFIG_PATH=" in cmd
    # The written command trains with the tuned config, which Lightning accepts.
    words = shlex.split(cmd)
    assigned = dict(
        w.split("=", 1)
        for w in words
        if "=" in w and not w.startswith("-") and w.isascii() and w.split("=", 1)[0].isupper()
    )
    argv = [sys.executable if w == "python" else w for w in words[len(assigned) :]]
    trained = run(argv, tmp_path, **assigned)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "final loss" in trained.stdout
