"""Process and shared-memory checks for tests and benchmarks that run real trials."""

import os
import subprocess
import sys
import time
from pathlib import Path


def trial_processes(results_dir) -> list[int]:
    """Processes started for a trial under ``results_dir`` (absolute): their environment names
    its probe.json, or the results folder they belong to."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if f"ZEROTUNE_PROBE={results_dir}".encode() in env or f"ZEROTUNE_RESULTS={results_dir}\0".encode() in env:
            found.append(int(pid))
    return found


def shm_buffers() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")}


def sleeper(results, tuner_pid, *, setsid=False, cwd=None):
    """A trial-like process of ``results`` (as given: relative to ``cwd`` or absolute) that
    ignores SIGTERM; returns once it does (it says so in a file). ``setsid``: it runs in a
    session of its own, as a daemon a script starts does."""
    from zerotune.launch._leftovers import trial_env_marks

    marks = trial_env_marks(Path(cwd or ".") / results)
    env = {
        **os.environ,
        **marks,
        "ZEROTUNE_TUNER_PID": tuner_pid,
        "ZEROTUNE_PROBE": str(Path(results) / "_warm" / "slot0-1" / "serve.json"),
    }  # relative, as warm ranks'
    ready = Path(marks["ZEROTUNE_RESULTS"]).parent / f"ready.{tuner_pid}.{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); pathlib.Path(sys.argv[1]).touch(); time.sleep(600)",
            str(ready),
        ],
        env=env,
        cwd=cwd,
        start_new_session=setsid,
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting on the file, however slow the machine
    assert ready.exists(), "the sleeper did not start"
    return proc
