"""Warm trials with real DeepSpeed on CPU: one launch serves trials of different stages; the
habits of real scripts (DataLoader workers, atexit hooks, destroy_process_group, sys.exit, a
catch-all except) keep or retire the processes as they should; a ZeRO-1 trial run warm after a
ZeRO-3 one trains exactly as it does cold."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT
from procs import shm_buffers, trial_processes
from zerotune.launch import LocalLauncher, TrialJob
from zerotune.trials._settings import MeasureSettings
from zerotune.trials._trial import TrialSpec, TrialState

pytestmark = pytest.mark.integration
SCRIPT = ROOT / "tests" / "integration" / "warm_script.py"


@pytest.fixture(autouse=True)
def cpu_accelerator(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def job(tmp_path, name, stage, args, *, warm=True, max_seconds=2.0, adaptive=False):
    d = tmp_path / name
    d.mkdir()
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
    }
    (d / "ds_config.json").write_text(json.dumps(cfg))
    return TrialJob(
        spec=TrialSpec(stage=stage, micro_batch=4),
        trial_dir=d,
        script=str(SCRIPT),
        script_args=[*args, "--deepspeed_config", str(d / "ds_config.json")],
        local_rank_arg=True,
        num_gpus=2,
        budget=None,
        warmup_steps=1,
        min_steps=3,
        config=cfg,
        warm=warm,
        adaptive_warmup=adaptive,
        measure=MeasureSettings(max_measure_seconds=max_seconds, precision=0.5, trial_timeout=600, stall_timeout=120),
    )


def done(tmp_path, group, seq, rank=0):
    return json.loads((tmp_path / "_warm" / f"slot0-{group}" / f"done{seq}.rank{rank}.json").read_text())


def rank0(trial_dir):
    return json.loads((trial_dir / "rank0.json").read_text())


def losses(trial_dir):
    return json.loads((trial_dir / "losses.rank0.json").read_text())


def test_script_habits_keep_the_processes_warm_and_training_identical_to_cold(tmp_path):
    shm_before = shm_buffers()
    habits = ["--workers", "2", "--atexit", "--destroy"]
    launcher = LocalLauncher(device="cpu")
    try:
        # The tuner runs each phase's trials in worker threads that end with the phase; the warm
        # processes a thread started must outlive it (Linux's parent-death signal is per thread).
        with ThreadPoolExecutor(max_workers=1) as phase:
            z3 = phase.submit(launcher.run, job(tmp_path, "z3", 3, habits)).result()
        z1 = launcher.run(job(tmp_path, "z1", 1, habits, adaptive=True))
        ends = launcher.run(job(tmp_path, "ends", 0, ["--exit-after", "3"], max_seconds=600))
        again = launcher.run(job(tmp_path, "again", 1, habits, adaptive=True))
    finally:
        launcher.close()
    cold = LocalLauncher(device="cpu").run(job(tmp_path, "cold", 1, habits, warm=False))
    for r in (z3, z1, ends, again, cold):
        assert r.state is TrialState.OK, (r.name, r.reason)
    assert z3.start.startswith("cold (new warm processes") and not z3.retired
    assert z1.start == "warm (trial 2 of its processes)" and not z1.retired
    assert ends.start == "warm (trial 3 of its processes)" and "finished before" in ends.reason
    assert cold.start == "cold" and not cold.warm
    # A later trial of the same program and ZeRO-3 or not takes the FLOPs an earlier one profiled,
    # the same as a cold profile, and times its step 1 where it needs no more memory than an
    # earlier trial of its processes held. ZeRO-3 profiles anew: the profiler counts its forward
    # differently (twice the FLOPs here).
    z3_flops, z1_flops = rank0(tmp_path / "z3"), rank0(tmp_path / "z1")
    carried, profiled = rank0(tmp_path / "again"), rank0(tmp_path / "cold")
    assert (
        z1_flops["flops_note"].endswith("flops profiler") and z3_flops["flops_per_step"] != z1_flops["flops_per_step"]
    )
    assert "profiled them" in carried["flops_note"] and profiled["flops_note"].endswith("flops profiler")
    assert carried["flops_per_step"] == profiled["flops_per_step"] == z1_flops["flops_per_step"] > 0
    # (its DataLoader workers start in step 1 here, so the rule may still call it warm-up)
    assert carried["first_step_from"] is not None
    assert carried["warmup_steps"] + len(carried["intervals"]) == len(carried["times"])
    first = done(tmp_path, 1, 0)
    assert first["clean"] and first["destroyed_group"] and first["atexit_hooks"] >= 1 and first["children"] == 0
    assert "FWD_MODULE_STACK" in first["cleared"]  # ZeRO-3's leak, cleared
    assert not list(tmp_path.glob("*/atexit.rank*"))  # as in a cold trial, which ends with os._exit
    # A ZeRO-1 trial run after a ZeRO-3 one in the same processes trains bit for bit as it does cold.
    warm_losses, cold_losses = losses(tmp_path / "z1"), losses(tmp_path / "cold")
    n = min(len(warm_losses), len(cold_losses))
    assert n >= 3 and warm_losses[:n] == cold_losses[:n]
    assert trial_processes(tmp_path) == []
    assert shm_buffers() <= shm_before


def test_a_trial_that_does_not_end_cleanly_retires_the_processes(tmp_path):
    launcher = LocalLauncher(device="cpu")
    try:
        first = launcher.run(job(tmp_path, "first", 0, []))
        caught = launcher.run(job(tmp_path, "caught", 1, ["--catch"]))
        oom = launcher.run(job(tmp_path, "oom", 0, ["--oom-at", "2"]))
        after = launcher.run(job(tmp_path, "after", 0, []))
    finally:
        launcher.close()
    assert first.state is TrialState.OK and not first.retired
    # The script swallowed zerotune's stop: its result stands, its processes are not trusted again.
    assert (
        caught.state is TrialState.OK and caught.start.startswith("warm") and "caught zerotune's stop" in caught.retired
    )
    assert oom.state is TrialState.OOM and oom.start.startswith("cold (new") and oom.retired
    assert after.state is TrialState.OK and after.start.startswith("cold (new")
    assert (tmp_path / "_warm" / "slot0-1" / "retired.txt").exists()
    assert trial_processes(tmp_path) == []
