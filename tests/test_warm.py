"""Warm trials without DeepSpeed's launcher: the rank-side sandbox and leak checks, and the
tuner-side protocol (orders, done files, retiring) against a fake serving process."""

import atexit
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from zerotune.launch import TrialJob
from zerotune.launch._local import near_budget
from zerotune.launch._process import ProcessGroup
from zerotune.launch._warm_pool import WarmGroup, kind_of, run_in_group, signature
from zerotune.probe._memory import current_rss, peak_rss, reset_peak
from zerotune.probe._sandbox import TrialSandbox, clear_deepspeed_caches, lru_cache_in
from zerotune.probe._serve import LeakCheck, process_counts
from zerotune.trials._settings import MeasureSettings
from zerotune.trials._trial import Measurement, TrialResult, TrialSpec, TrialState


# -- rank side -------------------------------------------------------------------------------
def test_leak_check_allows_one_growth_per_kind_then_none():
    check = LeakCheck()
    assert check.check("z0", {"threads": 5, "fds": 25, "children": 0}) == ""
    assert check.check("z3", {"threads": 8, "fds": 31, "children": 0}) == ""  # first ZeRO-3: one-time growth
    assert check.check("z0", {"threads": 8, "fds": 31, "children": 0}) == ""  # back to the baseline
    why = check.check("z3", {"threads": 9, "fds": 31, "children": 0})
    assert "threads grew from 8 to 9" in why and "(z3)" in why


def test_leak_check_refuses_child_processes_left_running():
    assert "2 child process(es)" in LeakCheck().check("z0", {"threads": 5, "fds": 25, "children": 2})


def test_process_counts_see_a_child_until_it_ends():
    before = process_counts()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert process_counts()["children"] == before["children"] + 1
    finally:
        child.communicate(b"")
    assert process_counts()["children"] == before["children"]


def test_sandbox_puts_back_what_a_trial_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist

    script = tmp_path / "train.py"
    script.write_text("")
    (tmp_path / "helper_mod_for_sandbox.py").write_text("STATE = []\n")
    linear, module_call, cwd, argv = torch.nn.functional.linear, torch.nn.Module.__call__, os.getcwd(), list(sys.argv)
    handler = signal.getsignal(signal.SIGTERM)
    box = TrialSandbox(str(script))
    box.enter()
    # What scripts (and ZeRO-3) do to a process:
    torch.nn.functional.linear = lambda *a, **k: None
    torch.nn.Module.__call__ = lambda self, *a, **k: None
    torch.nn.Module.added_by_script = 1
    os.environ["ZEROTUNE_TEST_SANDBOX"] = "1"
    sys.path.insert(0, str(tmp_path))
    sys.argv[:] = ["train.py", "--x"]
    os.chdir(tmp_path)
    signal.signal(signal.SIGTERM, lambda *a: None)
    __import__("helper_mod_for_sandbox")  # the script's own module

    atexit.register(print, "never run")
    assert dist.destroy_process_group() is None  # put off: the warm process keeps its group
    restored = box.exit()
    assert torch.nn.functional.linear is linear and torch.nn.Module.__call__ is module_call
    assert not hasattr(torch.nn.Module, "added_by_script")
    assert "linear.linear" not in restored and any(r.endswith(".linear") for r in restored)
    assert "ZEROTUNE_TEST_SANDBOX" not in os.environ and str(tmp_path) not in sys.path
    assert os.getcwd() == cwd and sys.argv == argv and signal.getsignal(signal.SIGTERM) is handler
    assert "helper_mod_for_sandbox" not in sys.modules  # imported afresh next trial, as cold
    assert box.atexit_hooks == [print] and box.destroyed_group
    assert atexit.register is not None and dist.destroy_process_group.__name__ == "destroy_process_group"


def test_lru_cache_is_found_under_a_closure_decorator():
    import functools

    @functools.cache
    def cached(x):
        return [x]

    def nvtx_like(func):
        def wrapped(*a):
            return func(*a)

        return wrapped

    wrapped = nvtx_like(cached)
    assert lru_cache_in(wrapped) is cached
    assert lru_cache_in(lambda: None) is None


def test_deepspeed_caches_are_cleared(monkeypatch):
    import functools
    import types

    offload = types.ModuleType("offload")
    offload.FWD_MODULE_STACK = ["top module"]

    class Coordinator:
        @functools.cache  # noqa: B019 -- a cache on a method, as DeepSpeed keeps one: what the sandbox clears
        def _Coordinator__params(self, x):
            return x

    coordinator = types.ModuleType("coordinator")
    coordinator.PartitionedParameterCoordinator = Coordinator
    Coordinator()._Coordinator__params(1)
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.parameter_offload", offload)
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.partitioned_param_coordinator", coordinator)
    assert clear_deepspeed_caches() == ["FWD_MODULE_STACK", "_Coordinator__params"]
    assert offload.FWD_MODULE_STACK == [] and Coordinator._Coordinator__params.cache_info().currsize == 0


def test_peak_memory_resets_for_the_next_trial():
    block = bytearray(200 << 20)
    block[::4096] = b"x" * len(block[::4096])
    del block
    assert peak_rss() > current_rss() + (100 << 20)
    import torch

    assert reset_peak(torch)
    assert peak_rss() < current_rss() + (50 << 20)


# -- tuner side ------------------------------------------------------------------------------
def job(tmp_path, **kw):
    d = tmp_path / "z1_mb2_gas1"
    d.mkdir(exist_ok=True)
    (d / "probe.json").write_text("{}")
    base = dict(
        spec=TrialSpec(stage=1, micro_batch=2),
        trial_dir=d,
        script="train.py",
        script_args=[],
        local_rank_arg=False,
        num_gpus=2,
        budget=None,
        warmup_steps=1,
        min_steps=3,
        measure=MeasureSettings(trial_timeout=60, stall_timeout=30),
        config={"zero_optimization": {"stage": 1}},
    )
    return TrialJob(**{**base, **kw})


FAKE_SERVE = textwrap.dedent("""
    # Two "ranks" in one process: per order, write each rank's result and done file as told.
    import json, os, sys, time
    pool = sys.argv[1]
    seq = 0
    while True:
        path = os.path.join(pool, f"order{seq}.json")
        while not os.path.exists(path):
            time.sleep(0.01)
        order = json.load(open(path))
        behaviour = open(os.path.join(pool, "behaviour")).read().strip()
        out = os.path.dirname(order["probe"])
        if behaviour == "die":
            os._exit(7)
        for r in range(2):
            rank = {"state": "ok", "reason": "", "times": [0, 1, 2, 3, 4], "intervals": [1.0] * 4,
                    "samples_per_step": 4, "warmup_steps": 1, "peak_memory": 100, "kind": order["kind"]}
            json.dump(rank, open(os.path.join(out, f"rank{r}.json"), "w"))
            why = "a DeepSpeed engine of the trial is still alive after teardown" if behaviour == "leak" and r == 1 else ""
            json.dump({"clean": not why, "why": why}, open(os.path.join(pool, f"done{seq}.rank{r}.json"), "w"))
        seq += 1
""")


@pytest.fixture
def fake_group(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "behaviour").write_text("clean")
    serve = tmp_path / "serve.py"
    serve.write_text(FAKE_SERVE)
    group = ProcessGroup([sys.executable, str(serve), str(pool)], env=dict(os.environ), log=pool / "launcher.log")
    warm = WarmGroup(pool=pool, group=group, port=0, signature="s", world=2, started_as="fake serve\n")
    yield warm
    group.kill()


def test_a_clean_trial_keeps_the_group_serving(tmp_path, fake_group):
    result, why = run_in_group(fake_group, job(tmp_path), job(tmp_path).trial_dir)
    assert why == "" and result.state is TrialState.OK and fake_group.alive and fake_group.seq == 1
    assert json.loads((fake_group.pool / "order0.json").read_text())["kind"] == "z1"
    assert "trial 1 of the processes" in (job(tmp_path).trial_dir / "cmd.txt").read_text()
    result, why = run_in_group(fake_group, job(tmp_path), job(tmp_path).trial_dir)
    assert why == "" and fake_group.seq == 2


def test_one_rank_failing_its_leak_check_retires_the_group(tmp_path, fake_group):
    (fake_group.pool / "behaviour").write_text("leak")
    result, why = run_in_group(fake_group, job(tmp_path), job(tmp_path).trial_dir)
    assert result.state is TrialState.OK  # the result stands
    assert "still alive" in why
    assert not fake_group.idle  # a rank may still be at work: retired with a grace


def test_a_group_is_idle_between_clean_trials_only(tmp_path, fake_group):
    """Idle ranks (every one reported a clean end and waits) are retired without a grace; a
    group with an order out is not idle."""
    assert not fake_group.idle
    run_in_group(fake_group, job(tmp_path), job(tmp_path).trial_dir)
    assert fake_group.idle
    fake_group.order(job(tmp_path).trial_dir / "probe.json", "z1")
    assert not fake_group.idle


def test_processes_that_die_mid_trial_retire_the_group_and_the_trial_crashed(tmp_path, fake_group):
    (fake_group.pool / "behaviour").write_text("die")
    result, why = run_in_group(fake_group, job(tmp_path), job(tmp_path).trial_dir)
    assert result.state is TrialState.CRASHED and why
    assert not fake_group.alive


def test_a_silent_group_times_out(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    group = ProcessGroup([sys.executable, "-c", "import signal; signal.pause()"], env=dict(os.environ), log=None)
    warm = WarmGroup(pool=pool, group=group, port=0, signature="s", world=2, started_as="")
    try:
        result, why = run_in_group(
            warm, job(tmp_path, measure=MeasureSettings(trial_timeout=0.5)), job(tmp_path).trial_dir
        )
    finally:
        group.kill()
    assert result.state is TrialState.TIMEOUT and why


def test_kind_and_signature():
    assert kind_of({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}) == "z3+offload_param=cpu"
    assert kind_of({}) == "z0"
    j = TrialJob(
        spec=TrialSpec(stage=0, micro_batch=1),
        trial_dir=Path("."),
        script="s",
        script_args=[],
        local_rank_arg=False,
        num_gpus=2,
        budget=None,
        warmup_steps=1,
        min_steps=3,
    )
    assert signature(j, {"A": "1", "ZEROTUNE_PROBE": "x"}) == signature(j, {"A": "1", "ZEROTUNE_PROBE": "y"})
    assert signature(j, {"A": "1"}) != signature(j, {"A": "2"})


def ok_result(peak, state=TrialState.OK, reason=""):
    m = Measurement(
        samples_per_step=4, step_time_mean=1.0, step_time_std=0.1, step_time_ci95=0.05, steps_measured=5, stable=True
    )
    return TrialResult(
        spec=TrialSpec(stage=0, micro_batch=1), state=state, reason=reason, measurement=m, peak_memory=[peak]
    )


def testnear_budget_results_are_measured_again_cold():
    assert not near_budget(ok_result(50), 100)
    assert near_budget(ok_result(90), 100)
    assert near_budget(ok_result(120, TrialState.OOM, "peak memory 120 B above the budget of 100 B"), 100)
    assert not near_budget(ok_result(120, TrialState.OOM, "CUDA out of memory"), 100)  # a real OOM stands
    assert not near_budget(ok_result(90), None)


def test_trials_are_warm_unless_cold_ones_are_asked_for(tuner_factory):
    tuner = tuner_factory({"warm_trials": True})
    tuner.tune()
    assert tuner.launcher.jobs and all(j.warm and not j.cold_reason for j in tuner.launcher.jobs)
    assert tuner.launcher.closed  # the warm processes end with the tuning
    for cold in (
        tuner_factory({"warm_trials": False}, results_dir=tuner.results_dir.parent / "b"),
        tuner_factory(None, warm_trials=False, results_dir=tuner.results_dir.parent / "c"),
    ):
        cold.tune()
        assert all(not j.warm and "--cold-trials" in j.cold_reason for j in cold.launcher.jobs)


def test_cli_cold_trials_flag_reaches_the_tuner(monkeypatch, tmp_path, script, make_config):
    from zerotune import tuning as tuner
    from zerotune.cli import _main as cli

    seen = {}

    class Stop(Exception):
        pass

    def fake_tuner(command, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(tuner, "Autotuner", fake_tuner)
    for flag, expect in ((["--cold-trials"], False), ([], None)):
        with pytest.raises(Stop):
            cli.main(["tune", *flag, str(script), "--deepspeed_config", str(make_config(None))])
        assert seen["cluster"].warm_trials is expect


def test_hpz_trials_run_cold_and_say_why(tuner_factory):
    tuner = tuner_factory(config={"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})
    tuner.tune()
    assert all(not j.warm and "hpZ" in j.cold_reason for j in tuner.launcher.jobs)


class FakeCuda:
    """torch.cuda as a warm process sees it on a GPU: peaks to reset, tensors still held."""

    def __init__(self, allocated):
        self.allocated, self.calls = allocated, []

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def empty_cache(self):
        self.calls.append("empty_cache")

    def reset_peak_memory_stats(self):
        self.calls.append("reset_peak_memory_stats")

    def memory_allocated(self):
        return self.allocated


def test_gpu_peak_is_reset_and_device_memory_checked_against_its_baseline():
    from types import SimpleNamespace

    from zerotune.probe._memory import device_in_use

    cuda = FakeCuda(allocated=10 << 20)
    torch = SimpleNamespace(cuda=cuda)
    assert reset_peak(torch) and cuda.calls == ["empty_cache", "reset_peak_memory_stats"]
    check = LeakCheck()
    assert check.check_device("z3", device_in_use(torch)) == ""  # the first of its kind: the baseline
    cuda.allocated += 512 << 10  # allocator rounding: still back at the baseline
    assert check.check_device("z3", device_in_use(torch)) == ""
    cuda.allocated += 120 << 20  # ZeRO-3 tensors left alive
    assert "device memory in use grew" in check.check_device("z3", device_in_use(torch))
    assert check.check_device("z0", None) == ""  # on CPU there is no device memory to check


def test_a_file_or_link_named_warm_in_the_results_folder_is_replaced_not_followed(tmp_path):
    from zerotune.launch._local import LocalLauncher

    outside = tmp_path / "outside"
    outside.mkdir()
    for kind in ("file", "link"):
        res = tmp_path / kind
        res.mkdir()
        if kind == "file":
            (res / "_warm").write_text("not a folder")
        else:
            (res / "_warm").symlink_to(outside, target_is_directory=True)
        launcher = LocalLauncher(device="cpu")
        j = job(res, work_dir=res, num_gpus=1)
        try:
            launcher._start_group(j, j.trial_dir, dict(os.environ), "s")  # noqa: SLF001 -- the folder step alone
        finally:
            launcher.close()
        assert (res / "_warm").is_dir() and not (res / "_warm").is_symlink()
    assert list(outside.iterdir()) == []


def test_near_budget_only_later_trials_of_a_group_are_measured_again_cold(tmp_path, fake_group, monkeypatch):
    """The first trial of new processes ran as a cold one does (its peak is a cold peak): no
    second launch for it; a later trial's peak may hold memory kept from earlier ones."""
    from zerotune.launch._local import LocalLauncher

    launcher = LocalLauncher(device="cpu")
    monkeypatch.setattr(launcher, "_start_group", lambda job, d, env, sig: fake_group)
    cold = []
    monkeypatch.setattr(launcher, "_remeasure_cold", lambda job, d, env, warm: cold.append(job.spec.name) or warm)
    near = job(tmp_path, warm=True, budget=110)  # the fake ranks peak at 100: within 15% of the budget
    first = launcher.run(near)
    assert first.state is TrialState.OK and "cold (new warm processes" in first.start and cold == []
    launcher.run(near)  # the same processes (their second order) serve the next trial
    assert cold == [near.spec.name]


def test_a_cold_re_measurement_says_whether_the_warm_peak_was_near_or_above_the_budget(tmp_path, monkeypatch):
    from zerotune.launch._local import LocalLauncher
    from zerotune.trials._trial import TrialResult

    launcher = LocalLauncher(device="cpu")
    monkeypatch.setattr(launcher, "retire", lambda key, why: None)
    monkeypatch.setattr(launcher, "_run_cold", lambda job, d, env: TrialResult(spec=job.spec, state=TrialState.OK))
    for peak, says in ((100, "was within 15% of the budget"), (300, "was above the budget")):
        near = job(tmp_path, warm=True, budget=110)
        warm = TrialResult(spec=near.spec, state=TrialState.OK, peak_memory=[peak, 90])
        assert says in launcher._remeasure_cold(near, near.trial_dir, {}, warm).start


def test_group_members_reads_the_group_and_skips_zombies(tmp_path):
    from zerotune.launch._process import group_members

    for pid, stat in {
        "10": "10 (python) S 1 77 77 0",
        "11": "11 (a) b (c)) R 10 77 77 0",
        "12": "12 (rank) Z 10 77 77 0",
        "13": "13 (other) S 1 78 78 0",
    }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat)
    (tmp_path / "self").mkdir()
    assert sorted(group_members(77, proc=tmp_path)) == [10, 11]


def test_killing_a_group_returns_once_every_member_is_gone(tmp_path):
    from zerotune.launch._process import group_members

    # The leader leaves at SIGTERM; its child ignores it and must be ended with the group.
    child = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open(r'{}', 'w').close(); time.sleep(600)"
    )
    ready = tmp_path / "ready"
    leader = (
        f"import subprocess, sys, signal, time; subprocess.Popen([sys.executable, '-c', {child.format(ready)!r}]); "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(600)"
    )
    group = ProcessGroup([sys.executable, "-c", leader], env=dict(os.environ), log=None)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert group.proc.poll() is None and time.monotonic() < deadline, "the child never started"
        time.sleep(0.01)
    assert len(group_members(group.proc.pid)) == 2
    group.kill(grace=0.5)
    assert group_members(group.proc.pid) == []


def test_killing_with_no_grace_sends_no_sigterm(tmp_path):
    """An idle group is ended with SIGKILL at once: what handles SIGTERM (DeepSpeed's launcher,
    0.8 s) never runs."""
    from zerotune.launch._process import group_members

    ready, handled = tmp_path / "ready", tmp_path / "handled"
    leader = (
        "import signal, sys, time; "
        f"signal.signal(signal.SIGTERM, lambda *a: (open(r'{handled}', 'w').close(), sys.exit(0))); "
        f"open(r'{ready}', 'w').close(); time.sleep(600)"
    )
    group = ProcessGroup([sys.executable, "-c", leader], env=dict(os.environ), log=None)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert group.proc.poll() is None and time.monotonic() < deadline, "the leader never started"
        time.sleep(0.01)
    group.kill(grace=0.0)
    assert group.proc.returncode == -signal.SIGKILL and not handled.exists()
    assert group_members(group.proc.pid) == []


def test_teardown_collects_until_the_engine_is_gone_and_no_further(tmp_path, monkeypatch):
    """A full collection of a process holding torch and DeepSpeed takes about 0.2 s: teardown
    makes the one that frees the engine (held in a reference cycle) and not another that would
    find nothing."""
    import gc
    import types
    import weakref

    from zerotune.probe import _serve as probe_warm

    class Engine:
        def destroy(self):
            pass

    script = tmp_path / "train.py"
    script.write_text("")
    box = TrialSandbox(str(script))
    box.enter()
    engine = Engine()
    engine.cycle = engine
    probe = types.SimpleNamespace(engines=weakref.WeakSet([engine]), engine=engine, memory=None)
    gone = weakref.ref(engine)
    del engine
    collections, collect = [], gc.collect
    monkeypatch.setattr(probe_warm.gc, "collect", lambda *a: collections.append(collect(*a)) or collections[-1])
    was_enabled = gc.isenabled()
    gc.disable()  # only teardown's own collections may free the engine
    try:
        probe_warm.teardown(probe, box)
    finally:
        if was_enabled:
            gc.enable()
    assert gone() is None
    assert len(collections) == 1 and collections[0] > 0
