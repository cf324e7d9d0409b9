"""Launcher fault handling without DeepSpeed: hang detection, port retries, signals, leftovers."""
import os
import subprocess
import sys
import time

from zerotune.launch import leftovers, reap
from zerotune.launch._collect import collect, port_in_use
from zerotune.launch._process import stalled
from zerotune.trial import TrialSpec, TrialState


def beat(d, rank, steps, longest, age):
    p = d / f"rank{rank}.progress"
    p.write_text(f"{steps} {longest}\n")
    t = time.time() - age
    os.utime(p, (t, t))


def test_no_heartbeat_yet_is_start_up_not_a_hang(tmp_path):
    assert stalled(tmp_path, 2, floor=5) is None


def test_hang_when_every_rank_is_silent_past_the_limit(tmp_path):
    beat(tmp_path, 0, 3, 0.5, age=20)
    beat(tmp_path, 1, 3, 0.5, age=2)
    assert stalled(tmp_path, 2, floor=10) is None  # rank 1 made progress recently
    beat(tmp_path, 1, 3, 0.5, age=12)
    reason = stalled(tmp_path, 2, floor=10)
    assert reason.startswith("hung:") and "after 3 optimizer steps" in reason


def test_the_limit_grows_with_the_slowest_step(tmp_path):
    beat(tmp_path, 0, 2, 30.0, age=100)  # 30 s steps: 100 s of silence is still within 5 x 30
    assert stalled(tmp_path, 1, floor=10) is None
    beat(tmp_path, 0, 2, 30.0, age=160)
    assert stalled(tmp_path, 1, floor=10) is not None


def collect_crash(d, log):
    (d / "launcher.log").write_text(log)
    return collect(spec=TrialSpec(stage=1, micro_batch=2), trial_dir=d, world=2, returncode=1, timed_out=False,
                   timeout=600, wall_time=1.0, budget=None, min_steps=3, rel_ci=0.03)


def test_a_segfault_is_named(tmp_path):
    r = collect_crash(tmp_path, "[launch.py:319] process 12 exits with return code = -11\n")
    assert r.state is TrialState.CRASHED and "SIGSEGV" in r.reason


def test_hung_trial_is_a_timeout_with_the_reason(tmp_path):
    r = collect(spec=TrialSpec(stage=1, micro_batch=2), trial_dir=tmp_path, world=2, returncode=None,
                timed_out=False, timeout=600, wall_time=1.0, budget=None, min_steps=3, rel_ci=0.03,
                hung="hung: no forward or optimizer step on any rank for 130 s")
    assert r.state is TrialState.TIMEOUT and r.reason.startswith("hung")


def test_port_in_use_is_recognised(tmp_path):
    (tmp_path / "rank0.stderr").write_text("RuntimeError: The server socket has failed to listen on any local "
                                           "network address. port: 29500, code: -98, name: EADDRINUSE\n")
    assert port_in_use(tmp_path, 2)
    (tmp_path / "rank0.stderr").write_text("ValueError: boom\n")
    assert not port_in_use(tmp_path, 2)


def sleeper(tmp_path, tuner_pid):
    """A trial-like process that ignores SIGTERM; returns once it does (it says so in a file)."""
    env = {**os.environ, "ZEROTUNE_PROBE": str(tmp_path / "z1_mb2" / "probe.json"), "ZEROTUNE_TUNER_PID": tuner_pid}
    ready = tmp_path / f"ready.{tuner_pid}.{len(list(tmp_path.glob('ready.*')))}"
    proc = subprocess.Popen([sys.executable, "-c", "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); pathlib.Path(sys.argv[1]).touch(); time.sleep(600)", str(ready)],
                            env=env)
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting on the file, however slow the machine
    assert ready.exists(), "the sleeper did not start"
    return proc


def test_leftovers_of_a_dead_tuner_are_found_and_ended(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = sleeper(tmp_path, str(dead.pid))
    ours = sleeper(tmp_path, str(os.getpid()))  # this process's own trial: never a leftover
    try:
        assert leftovers(tmp_path) == [orphan.pid]
        assert reap(tmp_path, grace=1.0) == 1  # it ignores SIGTERM: SIGKILL ends it
        assert orphan.wait(timeout=5) == -9
        assert ours.poll() is None
    finally:
        for p in (orphan, ours):
            p.kill()
            p.wait()


def test_the_rank_that_segfaulted_is_the_cause_not_the_one_left_waiting(tmp_path):
    import json

    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "state": "crashed",
                                                     "reason": "RuntimeError: Read error [127.0.0.1]: Connection reset"}))
    (tmp_path / "rank1.stderr").write_text("Fatal Python error: Segmentation fault\n\nCurrent thread:\n  File ...\n")
    r = collect_crash(tmp_path, "[launch.py:259] exits with return code = 1\n")
    assert r.reason.startswith("rank 1 was killed by SIGSEGV") and "then RuntimeError: Read error" in r.reason
