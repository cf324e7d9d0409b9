"""A warm process's later trial times its step 1 (see probe/_history.py): from the engine's
build, with the forward FLOPs an earlier trial of the process profiled, unless step 1 is
profiled, needed memory no earlier trial held, or runs on a GPU."""

import json
from types import SimpleNamespace

import pytest

from probe_fakes import Exited, FakeEngine, clock, drive
from zerotune.probe import _hooks
from zerotune.probe._history import ProcessHistory, zero_setup

BATCH_SHAPE, DTYPE = (16,), "torch.int64"  # what probe_fakes.drive feeds each forward: 4 x 16 token ids


def warm_probe(probe_factory, tmp_path, ticks, *, profiled=True, high_water=1 << 50, stages=(2,), **spec):
    """A probe in a warm process whose earlier trials profiled this program at batch 2 (10 FLOPs a
    sample), held ``high_water`` bytes at most and ran ZeRO ``stages`` (FakeEngine's is 2, no
    offload); ``ticks``: the clock, from the probe's start."""
    history = ProcessHistory()
    history.ended(high_water)
    for stage in stages:
        history.ran((stage, False, False))
    spec = {
        "adaptive_warmup": True,
        "profile_flops": True,
        "results_dir": str(tmp_path),
        "script": "train.py",
        "args": ["--deepspeed_config", str(tmp_path / "ds_config.json")],
        **spec,
    }
    probe = probe_factory(ticks, history=history, **spec)
    if profiled:
        key = ProcessHistory.flops_key(probe.spec, BATCH_SHAPE, DTYPE, 0, zero3=False)  # FakeEngine: stage 2
        history.profiled(key, fwd_flops=20.0, batch=2)
    return probe


def run(probe, steps):
    probe.engine_built()
    with pytest.raises(Exited):
        drive(probe, FakeEngine(), steps)
    return json.loads((probe.out / "rank0.json").read_text())


def test_a_later_warm_trial_times_step_1_from_the_engine_build(probe_factory, tmp_path):
    # start 0, engine built at 5, then steps of 1 s: step 1 is as long as the rest, and timed
    probe = warm_probe(probe_factory, tmp_path, [0.0] + clock([1.0] * 10, start=5.0))
    out = run(probe, 10)
    assert out["first_step_from"] == 5.0 and out["warmup_steps"] == 0
    assert out["intervals"][:3] == [1.0, 1.0, 1.0] and len(out["intervals"]) == len(out["times"])
    # its FLOPs: the earlier profile's per sample, at this trial's batch of 4, and said so
    assert out["fwd_flops"] == 40.0 and "an earlier trial in these processes profiled" in out["flops_note"]


def test_a_slow_step_1_still_warms_up(probe_factory, tmp_path):
    probe = warm_probe(probe_factory, tmp_path, [0.0] + clock([1.5] + [1.0] * 10, start=5.0))
    out = run(probe, 11)
    assert out["warmup_steps"] == 1 and all(abs(i - 1.0) < 1e-9 for i in out["intervals"])


def test_a_cold_process_never_times_step_1(probe_factory, tmp_path):
    probe = probe_factory([0.0] + clock([1.0] * 10, start=5.0)[1:], adaptive_warmup=True)
    with pytest.raises(Exited):
        probe.engine_built()  # no clock tick is read: a cold probe ignores the build
        drive(probe, FakeEngine(), 10)
    out = json.loads((tmp_path / "rank0.json").read_text())
    assert out["first_step_from"] is None and out["warmup_steps"] >= 1
    assert len(out["intervals"]) == len(out["times"]) - out["warmup_steps"]


def test_a_step_1_to_profile_warms_up(probe_factory, tmp_path):
    # nothing profiled for this program yet: step 1's first forward is profiled, so it is not timed
    probe = warm_probe(probe_factory, tmp_path, [0.0] + clock([1.0] * 10, start=5.0), profiled=False)
    assert probe.engine_built() is None and probe.ready == 5.0
    assert probe.before_forward(FakeEngine(), (_tokens(),), {}) is True
    assert probe.ready is None


def test_step_1_that_needed_new_memory_warms_up_and_so_may_step_2(probe_factory, tmp_path):
    # The first trial at a larger micro-batch: steps of 2.14 and 2.14 s, then 1.8 s.
    # Timed from step 1 the two equal slow steps look settled; with step 1 warm-up, step 2 is
    # judged against the steps after it, and warms up too.
    probe = warm_probe(probe_factory, tmp_path, [0.0] + clock([2.14, 2.14] + [1.8] * 10, start=5.0), high_water=1)
    out = run(probe, 12)
    assert out["first_step_from"] is None and out["warmup_steps"] == 2
    assert all(abs(i - 1.8) < 1e-9 for i in out["intervals"])


def test_the_first_trial_of_a_zero_stage_in_the_process_warms_up_step_1_and_its_slow_step_2(probe_factory, tmp_path):
    # z1_mb32_gas1 after stage 0's trials: 1.97, 2.31, 1.87 s. Timed from step 1 the
    # slow step 2 stays in (step 1 looks settled against it); with step 1 warm-up, step 2 is
    # judged against the steps after it and warms up too.
    ticks = [0.0] + clock([1.97, 2.31] + [1.87] * 10, start=5.0)
    out = run(warm_probe(probe_factory, tmp_path, ticks, stages=(0, 1)), 12)
    assert out["first_step_from"] is None and out["warmup_steps"] == 2
    assert all(abs(i - 1.87) < 1e-9 for i in out["intervals"])
    # the same steps where the process ran stage 2 before: step 1 is timed, and step 2 with it
    ticks = [0.0] + clock([1.97, 2.31] + [1.87] * 40, start=5.0)  # the slow step keeps it from settling soon
    out = run(warm_probe(probe_factory, tmp_path / "seen", ticks, stages=(0, 2)), 42)
    assert out["first_step_from"] == 5.0 and out["warmup_steps"] == 0
    assert out["intervals"][:2] == pytest.approx([1.97, 2.31])


def test_the_setup_is_recorded_when_a_trial_ends(probe_factory, tmp_path):
    probe = warm_probe(probe_factory, tmp_path, [0.0] + clock([1.0] * 10, start=5.0), stages=())
    assert probe.history.new_setup((2, False, False))
    run(probe, 10)
    assert not probe.history.new_setup((2, False, False)) and probe.history.new_setup((3, False, False))


def test_a_zero_setup_is_its_stage_and_what_it_offloads():
    engine = SimpleNamespace(
        zero_optimization_stage=lambda: 3,
        zero_offload_optimizer=lambda: {"device": "cpu"},
        zero_offload_param=lambda: None,
    )
    assert zero_setup(engine) == (3, True, False)
    assert zero_setup(SimpleNamespace(zero_optimization_stage=lambda: 1)) == (1, False, False)


def test_on_a_gpu_step_1_warms_up(probe_factory, tmp_path, monkeypatch):
    # Each trial empties the device's cache, so its step 1 allocates it again.
    cuda = SimpleNamespace(kind="cuda", current=lambda: 0, peak=lambda: 0, peak_allocated=lambda: 0)
    monkeypatch.setattr(_hooks, "MemoryReader", lambda *a: cuda)
    probe = warm_probe(probe_factory, tmp_path, [0.0] + clock([1.0] * 10, start=5.0))
    monkeypatch.setattr(probe, "_sync", lambda: None)  # no device to wait for here
    out = run(probe, 10)
    assert out["first_step_from"] is None and out["warmup_steps"] >= 1


def _tokens():
    import torch

    return torch.zeros(4, 16, dtype=torch.long)


def test_the_flops_key_reads_any_trial_s_files_as_the_same(tmp_path):
    results = tmp_path / "res"

    def spec(trial, model="small"):
        return {
            "script": "gpt.py",
            "out_dir": str(results / trial),
            "results_dir": str(results),
            "args": ["--model", model, "--deepspeed_config", str(results / trial / "ds_config.json")],
        }

    def key(s, shape=(64,), params=100, zero3=False):
        return ProcessHistory.flops_key(s, shape, DTYPE, params, zero3)

    a = key(spec("z0_mb8_gas4"))
    assert a == key(spec("z1_mb32_gas1/confirm1"))
    assert a != key(spec("z0_mb8_gas4", model="large"))  # another model
    assert a != key(spec("z0_mb8_gas4"), shape=(128,))  # longer samples
    assert a != key(spec("z0_mb8_gas4"), params=101)
    assert a != key(spec("z3_mb8_gas4"), zero3=True)  # ZeRO-3's forward counts differently
    # a file beside the results folder whose name starts like it is an argument like any other
    beside = {**spec("z0_mb8_gas4"), "args": ["--data", str(tmp_path / "res_data.bin")]}
    other = {**beside, "args": ["--data", str(tmp_path / "res_other.bin")]}
    assert key(beside) != key(other)
    assert key({**beside, "args": [f"--deepspeed_config={results / 'a' / 'ds.json'}"]}) == key(
        {**beside, "args": [f"--deepspeed_config={results / 'b' / 'ds.json'}"]}
    )


def test_the_high_water_mark_is_the_highest_trial_peak():
    history = ProcessHistory()
    assert history.grew(1)
    history.ended(1000)
    history.ended(800)
    assert history.high_water == 1000 and not history.grew(1005) and history.grew(1020)
