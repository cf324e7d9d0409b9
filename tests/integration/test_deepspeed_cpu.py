"""Real DeepSpeed trials on CPU: 2 processes, gloo, DeepSpeed's CPU accelerator."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT
from procs import shm_buffers, trial_processes
from zerotune import Autotuner, NoFeasibleConfigError
from zerotune.trials._trial import TrialState

pytestmark = pytest.mark.integration
ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}
GPT = ROOT / "examples" / "gpt.py"


@pytest.fixture(autouse=True)
def cpu_accelerator(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def config(tmp_path, **top):
    cfg = {
        "train_micro_batch_size_per_gpu": [8],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": [1, 2]},
        "autotuning": {"max_train_batch_size": 32, "start_profile_step": 2, "end_profile_step": 5},
        **top,
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return path


def test_run_tunes_two_stages_then_trains_with_the_result(tmp_path):
    shm_before = shm_buffers()
    res = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "zerotune.cli",
        "run",
        "--num-gpus",
        "2",
        "--results-dir",
        str(res),
        "--precision",
        "0.1",
        str(GPT),
        "--model",
        "tiny",
        "--steps",
        "20",
        "--log-every",
        "5",
        "--deepspeed_config",
        str(config(tmp_path)),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((res / "results.json").read_text())
    assert {t["name"] for t in results["trials"]} == {"z1_mb8_gas2", "z2_mb8_gas2"}
    assert all(t["state"] == "ok" for t in results["trials"])
    optimal = json.loads((res / "ds_config_optimal.json").read_text())
    best = results["best"]
    assert f"zero_stage={optimal['zero_optimization']['stage']}" in out.stdout  # the real run used it
    assert "micro_batch=8 grad_accum=2" in out.stdout and "step 20 loss" in out.stdout
    metrics = json.loads((res / best / "metrics.json").read_text())
    m = metrics["measurement"]
    assert m["samples_per_step"] == 32 and m["tokens_per_sample"] == 32 and m["steps_measured"] >= 3
    assert m["flops_per_step"] > 0 and metrics["num_params"] > 100_000
    assert len(metrics["peak_memory"]) == 2 and metrics["memory_kind"] == "cpu-rss"
    assert "deepspeed --num_gpus 2" in (res / "cmd_optimal.txt").read_text()
    # The same command again resumes: nothing is rerun.
    again = subprocess.run([*cmd[:3], "tune", *cmd[4:]], capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0 and again.stderr.count("(from disk)") == 2
    # DeepSpeed's CPU backend leaves ~66 MB per rank in /dev/shm; zerotune removes its trials' own.
    assert shm_buffers() <= shm_before


def test_budget_exceeded_on_cpu_is_oom_and_reported(tmp_path):
    tuner = Autotuner(
        [str(GPT), "--model", "tiny", "--deepspeed_config", str(config(tmp_path, zero_optimization={"stage": 2}))],
        num_gpus=2,
        memory_per_device="150MB",
        results_dir=tmp_path / "r",
    )
    with pytest.raises(NoFeasibleConfigError, match="oom"):
        tuner.tune()
    result = json.loads((tmp_path / "r" / "z2_mb8_gas2" / "result.json").read_text())["result"]
    assert result["state"] == "oom" and "budget" in result["reason"]


def test_crash_and_timeout_are_classified_and_leave_no_process(tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text(
        textwrap.dedent("""\
        import argparse, deepspeed, torch
        p = argparse.ArgumentParser(); p.add_argument("--local_rank", type=int)
        p = deepspeed.add_config_arguments(p); a = p.parse_args()
        print("no error here: the word error in output is fine", flush=True)
        m = torch.nn.Linear(4, 4)
        e, *_ = deepspeed.initialize(args=a, model=m, model_parameters=m.parameters())
        raise ValueError("shapes do not match (12 vs 13)")
        """)
    )
    tuner = Autotuner(
        [str(crash), "--deepspeed_config", str(config(tmp_path, zero_optimization={"stage": 1}))],
        num_gpus=2,
        results_dir=tmp_path / "r1",
    )
    with pytest.raises(NoFeasibleConfigError):
        tuner.tune()
    (result,) = tuner.result.trials
    assert result.state is TrialState.CRASHED and "ValueError: shapes do not match" in result.reason

    hang = tmp_path / "hang.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    tuner = Autotuner(
        [str(hang), "--deepspeed_config", str(config(tmp_path, zero_optimization={"stage": 1}))],
        num_gpus=2,
        results_dir=tmp_path / "r2",
        trial_timeout=8,
    )
    start = time.monotonic()
    with pytest.raises(NoFeasibleConfigError):
        tuner.tune()
    assert time.monotonic() - start < 60
    assert tuner.result.trials[0].state is TrialState.TIMEOUT
    time.sleep(0.5)
    assert trial_processes(tmp_path / "r2") == []


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_tuner_exit_leaves_no_trial_process(tmp_path, sig):
    import signal

    hang = tmp_path / "hang.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    res = tmp_path / "r"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zerotune.cli",
            "tune",
            "--num-gpus",
            "2",
            "--results-dir",
            str(res),
            str(hang),
            "--deepspeed_config",
            str(config(tmp_path, zero_optimization={"stage": 1})),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Started as a script's background job is: with SIGINT ignored. An explicit
        # interrupt must still end the tuning cleanly.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sig == "SIGINT" else None,
    )
    deadline = time.monotonic() + 60
    while len(trial_processes(res.resolve())) < 3 and time.monotonic() < deadline:  # launcher + 2 ranks
        time.sleep(0.2)
    assert len(trial_processes(res.resolve())) >= 3
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while trial_processes(res.resolve()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert trial_processes(res.resolve()) == []
    if sig != "SIGKILL":
        assert proc.returncode == 130 and "Rerun the same command to resume" in err


def test_python_api_with_a_function_entry_point(tmp_path):
    """From Python, as a notebook would: tune a training function, then train with the result."""
    (tmp_path / "tiny_job.py").write_text(
        textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(ROOT / "examples")!r})
        from gpt import train

        def train_tiny(ds_config):
            train(ds_config, model="tiny", steps=12, log_every=4)
        """)
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import tiny_job
    finally:
        sys.path.remove(str(tmp_path))
    events = []
    cfg = {
        "train_micro_batch_size_per_gpu": [4],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
        "autotuning": {"start_profile_step": 2},
    }
    tuner = Autotuner(
        tiny_job.train_tiny, cfg, num_gpus=2, results_dir=tmp_path / "r", precision=0.2, on_event=events.append
    )
    result = tuner.tune()
    assert result.best.state is TrialState.OK and result.best.name == "z2_mb4_gas1"
    assert [e.kind for e in events if e.kind in ("started", "finished")] == ["started", "finished"]
    assert tuner.run_after_tuning() == 0


def test_estimate_profiles_the_script_first(tmp_path, capsys):
    from zerotune.cli import main

    rc = main(
        [
            "estimate",
            "--num-gpus",
            "2",
            "--device-memory",
            "4GB",
            "--precision",
            "fp32",
            "--json",
            "--profile",
            str(GPT),
            "--model",
            "tiny",
            "--deepspeed_config",
            str(config(tmp_path)),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["model"]["source"].startswith("profiled: z1_mb8")
    assert out["model"]["num_params"] > 100_000 and out["model"]["activation_per_sample"] > 0
    assert all(isinstance(r["largest_micro_batch"], int) for r in out["rows"])  # activations known: a number
    assert out["rows"][0]["breakdown"]["overhead"] > 50 * 2**20  # the process itself, measured
