"""The fault matrix against the real launcher: each fault is classified, nothing hangs, no
process is left behind (small fake trial scripts, real DeepSpeed on CPU)."""

import json
import socket
import time

import pytest

from conftest import ROOT
from procs import shm_buffers, trial_processes
from zerotune.launch import LocalLauncher, TrialJob, _local
from zerotune.trials._settings import MeasureSettings
from zerotune.trials._trial import TrialSpec, TrialState

pytestmark = pytest.mark.integration
FAULTY = ROOT / "tests" / "integration" / "faulty_trial.py"


def run_fault(tmp_path, fault):
    d = tmp_path / "trial"
    d.mkdir()
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 0},
    }
    (d / "ds_config.json").write_text(json.dumps(cfg))
    job = TrialJob(
        spec=TrialSpec(stage=0, micro_batch=4),
        trial_dir=d,
        script=str(FAULTY),
        script_args=["--faults", json.dumps({"0": fault}), "--deepspeed_config", str(d / "ds_config.json")],
        local_rank_arg=True,
        num_gpus=2,
        budget=None,
        warmup_steps=1,
        min_steps=3,
        measure=MeasureSettings(max_measure_seconds=3.0, precision=0.5, trial_timeout=900, stall_timeout=5.0),
    )
    start = time.monotonic()
    result = LocalLauncher(device="cpu").run(job)
    return result, time.monotonic() - start, d


@pytest.fixture(autouse=True)
def cpu_accelerator(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def tuning_config(tmp_path, stage):
    """A ds_config over ``stage`` (a stage or a list of them) for a tuning of the faulty script."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": [4],
                "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": stage},
                "autotuning": {"start_profile_step": 2, "end_profile_step": 5},
            }
        )
    )
    return cfg


# exit 1, the word "error" in output and a slow start are covered by unit tests and by
# bench/faults.py; these four need real processes to show that nothing hangs or lingers.
def wait_for(condition, seconds: float = 60) -> bool:
    """Poll ``condition`` until it holds or ``seconds`` pass (generous: a loaded machine is slow)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize(
    "fault, state, reason",
    [
        ("segv", TrialState.CRASHED, "SIGSEGV"),
        ("hang", TrialState.TIMEOUT, "hung: no forward or optimizer step"),
        ("oom", TrialState.OOM, "out of memory"),
        ("rank_dies", TrialState.CRASHED, "rank 1 ended without reporting a result"),
        ("killed", TrialState.KILLED, "killed by SIGKILL from outside zerotune"),
    ],
)
def test_fault_is_classified_without_hanging_or_orphans(tmp_path, fault, state, reason):
    shm_before = shm_buffers()
    result, _, d = run_fault(tmp_path, fault)
    assert result.state is state, (result.reason, (d / "launcher.log").read_text()[-2000:])
    assert reason in result.reason
    assert "trial timeout" not in result.reason  # its own check ended it, not the (long) trial timeout
    assert wait_for(lambda: trial_processes(d) == []), trial_processes(d)
    assert shm_buffers() <= shm_before


def test_a_taken_master_port_is_retried_on_another(tmp_path, monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = iter([busy.getsockname()[1]])
    real = _local.free_port
    monkeypatch.setattr(_local, "free_port", lambda: next(ports, None) or real())
    try:
        result, _, d = run_fault(tmp_path, "none")
    finally:
        busy.close()
    assert result.state is TrialState.OK, result.reason
    assert (d / "launcher.attempt1.log").exists() and "in use" in (d / "launcher.log").read_text()


def test_sigkill_mid_trial_then_rerun_resumes_and_ends_the_leftovers(tmp_path):
    import signal
    import subprocess
    import sys

    from zerotune.launch import leftovers

    cfg = tuning_config(tmp_path, [0, 1])
    res = (tmp_path / "results").resolve()
    # Stage 1's ranks ignore SIGTERM and stop making progress: only SIGKILL ends them. The stall
    # timeout is long, so that the tuner is killed before it would end the hung trial itself,
    # however slow a loaded machine makes the ranks. The results folder is given relative to the
    # tuner's folder, as the default one is: the rerun finds the leftovers all the same.
    cmd = [
        sys.executable,
        "-m",
        "zerotune.cli",
        "tune",
        "--num-gpus",
        "2",
        "--results-dir",
        "results",
        "--precision",
        "0.2",
        "--stall-timeout",
        "300",
        str(FAULTY),
        "--faults",
        '{"1": "ignore_term"}',
        "--fault-once",
        str(tmp_path / "struck"),
        "--deepspeed_config",
        str(cfg),
    ]
    env = {**__import__("os").environ, "DS_ACCELERATOR": "cpu"}
    shm_before = shm_buffers()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    # Stage 1's ranks say when they ignore SIGTERM (a file each): wait on those, not on a clock.
    assert wait_for(lambda: len(list(res.glob("z1_*/ignoring_term.rank*"))) == 2, 900)
    first = next(res.glob("z0_*/result.json"))
    first_written = first.stat().st_mtime
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    # The launcher dies with the tuner; the ranks that ignore SIGTERM outlive it.
    assert wait_for(lambda: leftovers(res) and len(trial_processes(res)) == len(leftovers(res)), 60), (
        "the ranks that ignore SIGTERM outlive the killed tuner"
    )
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "that an earlier, killed tuning of this folder left running" in " ".join((out.stdout + out.stderr).split())
    assert first.stat().st_mtime == first_written  # the finished trial was not rerun
    results = json.loads((res / "results.json").read_text())
    states = {t["spec"]["stage"]: t["state"] for t in results["trials"]}
    assert states == {0: "ok", 1: "ok"}  # the interrupted trial ran again (its fault struck only once)
    assert wait_for(lambda: trial_processes(res) == [] and leftovers(res) == [])
    assert shm_buffers() <= shm_before  # the killed tuning's buffers were removed by the rerun


def test_a_daemon_the_script_starts_is_ended_and_named(tmp_path):
    import subprocess
    import sys

    cfg = tuning_config(tmp_path, 0)
    res = (tmp_path / "results").resolve()
    cmd = [
        sys.executable,
        "-m",
        "zerotune.cli",
        "tune",
        "--num-gpus",
        "2",
        "--results-dir",
        str(res),
        "--precision",
        "0.2",
        str(FAULTY),
        "--faults",
        '{"0": "daemon"}',
        "--deepspeed_config",
        str(cfg),
    ]
    out = subprocess.run(
        cmd, env={**__import__("os").environ, "DS_ACCELERATOR": "cpu"}, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    assert "that this tuning's trials left running" in text and "sleep 900" in text, text[-1500:]
    assert "sleep 900" in (res / "summary.txt").read_text()
    assert trial_processes(res) == []


def test_a_second_ctrl_c_does_not_cut_the_clean_up_short(tmp_path):
    import signal
    import subprocess
    import sys

    cfg = tuning_config(tmp_path, [0, 1])
    res = (tmp_path / "results").resolve()
    cmd = [
        sys.executable,
        "-m",
        "zerotune.cli",
        "tune",
        "--num-gpus",
        "2",
        "--results-dir",
        str(res),
        "--stall-timeout",
        "300",
        str(FAULTY),
        "--faults",
        '{"0": "hang"}',
        "--deepspeed_config",
        str(cfg),
    ]
    shm_before = shm_buffers()
    proc = subprocess.Popen(
        cmd,
        env={**__import__("os").environ, "DS_ACCELERATOR": "cpu"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Stage 0's ranks have trained (their buffers exist) once both write a heartbeat.
    assert wait_for(lambda: len(list(res.glob("z0_*/rank*.progress"))) == 2, 900)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)  # at once: while the first one's clean-up runs
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Rerun the same command to resume" in err
    assert wait_for(lambda: trial_processes(res) == [])
    assert shm_buffers() <= shm_before
