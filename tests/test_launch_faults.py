"""Launcher fault handling without DeepSpeed: hang detection, port retries, signals, leftovers."""

import os
import subprocess
import sys
import time

from procs import sleeper
from zerotune.launch import end_leftovers, leftovers
from zerotune.launch._collect import collect, port_in_use
from zerotune.launch._process import stalled
from zerotune.trials._trial import TrialSpec, TrialState


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
    return collect(
        spec=TrialSpec(stage=1, micro_batch=2),
        trial_dir=d,
        world=2,
        returncode=1,
        timed_out=False,
        timeout=600,
        wall_time=1.0,
        budget=None,
        min_steps=3,
        rel_ci=0.03,
    )


def test_a_segfault_is_named(tmp_path):
    r = collect_crash(tmp_path, "[launch.py:319] process 12 exits with return code = -11\n")
    assert r.state is TrialState.CRASHED and "SIGSEGV" in r.reason


def test_hung_trial_is_a_timeout_with_the_reason(tmp_path):
    r = collect(
        spec=TrialSpec(stage=1, micro_batch=2),
        trial_dir=tmp_path,
        world=2,
        returncode=None,
        timed_out=False,
        timeout=600,
        wall_time=1.0,
        budget=None,
        min_steps=3,
        rel_ci=0.03,
        hung="hung: no forward or optimizer step on any rank for 130 s",
    )
    assert r.state is TrialState.TIMEOUT and r.reason.startswith("hung")


def test_port_in_use_is_recognised(tmp_path):
    (tmp_path / "rank0.stderr").write_text(
        "RuntimeError: The server socket has failed to listen on any local "
        "network address. port: 29500, code: -98, name: EADDRINUSE\n"
    )
    assert port_in_use(tmp_path, 2)
    (tmp_path / "rank0.stderr").write_text("ValueError: boom\n")
    assert not port_in_use(tmp_path, 2)


def test_leftovers_of_another_tuner_are_found_from_a_relative_results_folder(tmp_path):
    (tmp_path / "results").mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = sleeper("results", str(dead.pid), cwd=tmp_path)  # started with the folder as a relative path
    ours = sleeper("results", str(os.getpid()), cwd=tmp_path)  # this process's own trial: not another's
    try:
        found = leftovers(tmp_path / "results")
        assert [p.pid for p in found] == [orphan.pid]
        assert [p.pid for p in end_leftovers(tmp_path / "results")] == [orphan.pid]  # SIGKILL after SIGTERM
        assert orphan.wait(timeout=5) == -9
        assert ours.poll() is None
        assert [p.pid for p in leftovers(tmp_path / "results", own=True)] == [ours.pid]
    finally:
        for p in (orphan, ours):
            p.kill()
            p.wait()


def test_a_daemon_a_trial_started_is_ended_with_the_tuning(tmp_path):
    daemon = sleeper(tmp_path / "results", str(os.getpid()), setsid=True)
    try:
        ended = end_leftovers(tmp_path / "results", own=True)
        assert [p.pid for p in ended] == [daemon.pid] and "python" in ended[0].command
        assert daemon.wait(timeout=5) == -9
    finally:
        daemon.kill()
        daemon.wait()


def test_buffers_of_dead_trials_are_removed_and_only_theirs(tmp_path):
    from zerotune.launch._leftovers import note_port, remove_dead_buffers

    shm, results = tmp_path / "shm", tmp_path / "results"
    shm.mkdir(), results.mkdir()
    uid = os.getuid()
    ours = [shm / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_4100_{i}" for i in (0, 1)]
    other = shm / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_4200_0"  # another job's port
    for p in ours + [other]:
        p.write_bytes(b"x")
    note_port(results, 4100)
    assert remove_dead_buffers(results, shm_dir=shm) == 2
    assert not any(p.exists() for p in ours) and other.exists()
    assert not (results / "_shm_ports.txt").exists()


def test_the_rank_that_segfaulted_is_the_cause_not_the_one_left_waiting(tmp_path):
    import json

    (tmp_path / "rank0.json").write_text(
        json.dumps({"rank": 0, "state": "crashed", "reason": "RuntimeError: Read error [127.0.0.1]: Connection reset"})
    )
    (tmp_path / "rank1.stderr").write_text("Fatal Python error: Segmentation fault\n\nCurrent thread:\n  File ...\n")
    r = collect_crash(tmp_path, "[launch.py:259] exits with return code = 1\n")
    assert r.reason.startswith("rank 1 was killed by SIGSEGV") and "then RuntimeError: Read error" in r.reason


def test_the_waiter_records_the_signal_its_rank_died_of_and_dies_of_it_too(tmp_path):
    from zerotune._proc import read_exit

    code = (
        "import os, signal, sys\nfrom pathlib import Path\nfrom zerotune.probe._waiter import run_watched\n"
        "run_watched(Path(sys.argv[1]), 1)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert proc.returncode == -9 and read_exit(tmp_path, 1) == 9
    clean = subprocess.run(
        [
            sys.executable,
            "-c",
            code.replace("os.kill(os.getpid(), signal.SIGKILL)", "sys.exit(3)"),
            str(tmp_path / "x"),
        ],
        timeout=60,
    )
    assert clean.returncode == 3 and read_exit(tmp_path / "x", 1) is None


def test_the_first_rank_to_die_names_the_cause(tmp_path):
    """Rank 1 was killed from outside; rank 0, ended later by the clean-up, is not the cause,
    whatever the launcher's log says."""
    (tmp_path / "launcher.log").write_text("[ERROR] ['python'] exits with return code = 1\n")
    (tmp_path / "rank1.exit").write_text("signal 9\n")
    (tmp_path / "rank0.exit").write_text("signal 15\n")
    os.utime(tmp_path / "rank1.exit", (1, 1))
    r = collect(
        spec=TrialSpec(stage=0, micro_batch=4),
        trial_dir=tmp_path,
        world=2,
        returncode=1,
        timed_out=False,
        timeout=60,
        wall_time=1.0,
        budget=None,
        min_steps=3,
        rel_ci=0.03,
        oom_kills=0,
    )
    assert r.state is TrialState.KILLED, r.reason


def test_retiring_warm_processes_ends_them_and_their_buffers_before_a_write_that_can_fail(tmp_path, monkeypatch):
    from zerotune import ZerotuneError
    from zerotune.launch import _local
    from zerotune.launch._warm_pool import WarmGroup

    done = []

    class Group:
        def kill(self, grace):
            done.append("killed")

    monkeypatch.setattr(_local, "remove_shm_buffers", lambda port: done.append(f"buffers of {port}"))
    launcher = _local.LocalLauncher(device="cpu")
    gone = tmp_path / "pool-on-a-full-disk"  # retired.txt cannot be written there
    launcher._warm[0] = WarmGroup(pool=gone, group=Group(), port=4100, signature="s", world=2, started_as="")
    try:
        launcher.retire(0, "the tuning ended")
    except ZerotuneError:
        pass
    assert done == ["killed", "buffers of 4100"]
