"""How a trial's leftovers are classified (no processes: files written by hand)."""

import json

import pytest

from zerotune.launch._collect import collect
from zerotune.trials._step_stats import t95_df
from zerotune.trials._trial import TrialSpec, TrialState

SPEC = TrialSpec(stage=2, micro_batch=8, grad_accum=1)


def rank(d, r, state="ok", reason="", intervals=(0.5, 0.52, 0.49, 0.51, 0.5), peak=1000, **kw):
    data = {
        "rank": r,
        "state": state,
        "reason": reason,
        "times": [0] * (len(intervals) + 3),
        "intervals": list(intervals),
        "warmup_steps": 3,
        "samples_per_step": 16,
        "tokens_per_sample": 64,
        "flops_per_step": None,
        "flops_note": "",
        "static_memory": 500,
        "peak_allocated": 900,
        "memory_kind": "cpu-rss",
        "peak_memory": peak,
        "num_params": 123,
        "note": "",
        **kw,
    }
    (d / f"rank{r}.json").write_text(json.dumps(data))


def run(d, returncode=0, timed_out=False, budget=None, oom_kills=None):
    return collect(
        spec=SPEC,
        trial_dir=d,
        world=2,
        returncode=returncode,
        timed_out=timed_out,
        timeout=60,
        wall_time=1.0,
        budget=budget,
        min_steps=3,
        rel_ci=0.03,
        oom_kills=oom_kills,
    )


def test_ok_with_statistics(tmp_path):
    rank(tmp_path, 0)
    rank(tmp_path, 1, peak=1100)
    r = run(tmp_path)
    assert r.state is TrialState.OK
    assert abs(r.measurement.throughput - 16 / 0.504) < 1e-6
    assert r.peak_memory == [1000, 1100] and r.measurement.steps_measured == 5 and r.measurement.stable
    assert r.peak_allocated == [900, 900]
    assert r.measurement.step_time_df == 4  # five whole steps


def test_a_micro_step_estimate_keeps_its_degrees_of_freedom(tmp_path):
    rank(tmp_path, 0, estimate=[2.0, 0.05, 0.04], estimate_df=11.5)
    rank(tmp_path, 1)
    m = run(tmp_path).measurement
    assert (m.step_time_mean, m.step_time_ci95, m.step_time_df) == (2.0, 0.04, 11.5)
    se, df = m.standard_error
    # t for 11.5 degrees of freedom: between 11's (2.201) and 12's (2.179), read back as written
    assert df == 11.5 and 0.04 / 2.201 < se < 0.04 / 2.179 and abs(se * t95_df(11.5) - 0.04) < 1e-12
    rank(tmp_path, 0, estimate=[2.0, 0.05, 0.04], estimate_df="x")  # damaged: unknown, not a crash
    assert run(tmp_path).measurement.step_time_df is None


def test_a_disturbed_step_is_left_out_of_the_figure_and_kept_in_the_measurement(tmp_path):
    steps = [1.91, 1.88, 1.95, 2.73, 1.90, 1.93, 1.89, 1.92]
    rank(tmp_path, 0, intervals=steps)
    rank(tmp_path, 1, intervals=steps)
    m = run(tmp_path).measurement
    rest = [x for x in steps if x != 2.73]
    assert abs(m.step_time_mean - sum(rest) / 7) < 1e-12 and m.step_time_df == 6 and m.stable
    assert m.left_out == [2.73] and m.left_out_unit == "step" and abs(m.left_out_median - 1.915) < 1e-9
    # Still timed: the step count and the seconds the measurement took include it.
    assert m.steps_measured == 8 and abs(m.timed_seconds - sum(steps)) < 1e-12
    rank(tmp_path, 0)  # steady steps: nothing left out
    assert run(tmp_path).measurement.left_out == []


def test_micro_steps_left_out_by_the_probe_are_recorded(tmp_path):
    rank(tmp_path, 0, estimate=[2.0, 0.05, 0.04], estimate_df=11.5, left_out=[0.9], left_out_median=0.25)
    rank(tmp_path, 1)
    m = run(tmp_path).measurement
    assert (m.left_out, m.left_out_median, m.left_out_unit) == ([0.9], 0.25, "micro-step")
    rank(tmp_path, 0, estimate=[2.0, 0.05, 0.04], estimate_df=11.5, left_out=["x"], left_out_median=0.25)
    assert run(tmp_path).measurement.left_out == []  # damaged: nothing claimed


def test_an_early_stop_keeps_what_it_lost_to(tmp_path):
    rank(tmp_path, 0, early_stop=True, lost_to={"metric": "throughput", "value": 40.0})
    rank(tmp_path, 1)
    m = run(tmp_path).measurement
    assert m.early_stop and (m.lost_to, m.lost_to_metric) == (40.0, "throughput")
    rank(tmp_path, 0, early_stop=True, lost_to={"metric": "throughput", "value": "x"})  # damaged: unknown
    assert run(tmp_path).measurement.lost_to is None


def test_a_tie_is_kept_and_round_trips(tmp_path):
    from zerotune.trials._trial import TrialResult

    rank(tmp_path, 0, tied=True)
    rank(tmp_path, 1)
    r = run(tmp_path)
    assert r.measurement.tied and not r.measurement.early_stop
    back = TrialResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.measurement.tied
    damaged = r.to_dict()
    damaged["measurement"]["tied"] = "yes"
    with pytest.raises(ValueError, match="tied"):
        TrialResult.from_dict(damaged)
    rank(tmp_path, 0, tied=True, early_stop=True)  # a rank saying both: the early stop decided
    assert not run(tmp_path).measurement.tied


def test_word_error_in_normal_output_is_not_a_failure(tmp_path):
    rank(tmp_path, 0)
    rank(tmp_path, 1)
    (tmp_path / "rank0.stderr").write_text("warning: error-feedback compression enabled\nRuntimeError is fine\n")
    assert run(tmp_path).state is TrialState.OK


def test_over_budget_is_oom(tmp_path):
    rank(tmp_path, 0, peak=5000)
    rank(tmp_path, 1)
    r = run(tmp_path, budget=4000)
    assert r.state is TrialState.OOM


def test_probe_reported_oom(tmp_path):
    rank(tmp_path, 0, state="oom", reason="torch.OutOfMemoryError: CUDA out of memory.")
    assert run(tmp_path, returncode=3).state is TrialState.OOM


def test_cuda_oom_only_in_stderr(tmp_path):
    (tmp_path / "rank1.stderr").write_text("Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried\n")
    r = run(tmp_path, returncode=1)
    assert r.state is TrialState.OOM and "rank 1" in r.reason


def killed_rank(d, peak):
    """Rank 1 killed by SIGKILL; rank 0 reports the broken collective and its peak."""
    (d / "launcher.log").write_text("[ERROR] ['python'] exits with return code = -9\n")
    rank(d, 0, state="crashed", reason="RuntimeError: Connection reset by peer", peak=peak)


def test_sigkill_with_an_oom_kill_counted_is_out_of_memory(tmp_path):
    killed_rank(tmp_path, peak=1000)
    r = run(tmp_path, returncode=247, budget=12000, oom_kills=1)
    assert r.state is TrialState.OOM and "out-of-memory killer" in r.reason


def test_sigkill_without_an_oom_kill_is_a_kill_from_outside(tmp_path):
    killed_rank(tmp_path, peak=350)
    r = run(tmp_path, returncode=247, budget=12000, oom_kills=0)
    assert r.state is TrialState.KILLED and "from outside zerotune" in r.reason and "no out-of-memory" in r.reason


@pytest.mark.parametrize("peak, state", [(11500, TrialState.OOM), (350, TrialState.KILLED), (None, TrialState.KILLED)])
def test_sigkill_where_the_kernel_keeps_no_count_is_judged_by_the_peak(tmp_path, peak, state):
    (tmp_path / "launcher.log").write_text("[ERROR] ['python'] exits with return code = -9\n")
    if peak is not None:
        rank(tmp_path, 0, state="crashed", reason="RuntimeError: Connection reset", peak=peak)
    assert run(tmp_path, returncode=247, budget=12000, oom_kills=None).state is state


def test_a_killed_trial_is_measured_again_and_never_reused(tmp_path):
    from zerotune.results._record import Identity, TuningRecord
    from zerotune.trials._trial import TrialResult

    ident = Identity(code="c", args=[], topology={}, measure={}, env={}, failure={})
    record = TuningRecord(tmp_path, identity=ident, session={})
    result = TrialResult(spec=SPEC, state=TrialState.KILLED, reason="killed", wall_time=1.0)
    stored = {"identity": ident.of({}), "result": result.to_dict(), "failure": {}}
    assert record.why_not_reused(stored, {}) == "it was killed from outside zerotune"


def test_oom_kill_count_reads_cgroup_v1_and_v2(tmp_path):
    from zerotune.launch._oom_kills import oom_kill_count

    own = tmp_path / "cgroup"
    own.write_text("4:memory:/job/a\n0::/\n")
    (tmp_path / "fs" / "memory" / "job" / "a").mkdir(parents=True)
    (tmp_path / "fs" / "memory" / "job" / "a" / "memory.oom_control").write_text("oom_kill_disable 0\noom_kill 3\n")
    assert oom_kill_count(own, tmp_path / "fs") == 3
    own.write_text("0::/user.slice/x\n")
    (tmp_path / "fs" / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n")
    assert oom_kill_count(own, tmp_path / "fs") == 1  # the namespace's root, where the path is not mounted
    own.write_text("1:cpu:/\n")
    assert oom_kill_count(own, tmp_path / "fs") is None


def test_crash_names_the_error(tmp_path):
    (tmp_path / "rank0.stderr").write_text("Traceback (most recent call last):\n  ...\nValueError: bad shape\n")
    r = run(tmp_path, returncode=1)
    assert r.state is TrialState.CRASHED and "ValueError: bad shape" in r.reason


def test_timeout(tmp_path):
    assert run(tmp_path, returncode=None, timed_out=True).state is TrialState.TIMEOUT


def test_script_too_short_to_measure(tmp_path):
    rank(tmp_path, 0, intervals=())
    rank(tmp_path, 1, intervals=())
    r = run(tmp_path)
    assert r.state is TrialState.CRASHED and "let it train longer" in r.reason


def test_deepspeed_shm_buffers_of_the_trial_are_removed(tmp_path):
    import os

    from zerotune.launch._leftovers import remove_shm_buffers

    uid = os.getuid()
    ours = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_4100_{r}" for r in (0, 1)]
    other = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_41000_0"  # another job's port
    for p in [*ours, other]:
        p.write_bytes(b"x")
    assert remove_shm_buffers(4100, shm_dir=tmp_path) == 2
    assert not any(p.exists() for p in ours) and other.exists()


def test_a_known_error_names_its_fix():
    from zerotune.launch._collect import known_fix

    hf_cpu = (
        "rank 0: AssertionError: Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 8 != 8 * 1 * 2"
    )
    assert "leave train_batch_size out of the ds_config" in known_fix(hf_cpu)
    assert known_fix(known_fix(hf_cpu)) == known_fix(hf_cpu)
    assert known_fix("RuntimeError: boom") == "RuntimeError: boom"


def _deepspeed_arch_error(monkeypatch, arch: str) -> str:
    """What DeepSpeed's own JIT builder says of this TORCH_CUDA_ARCH_LIST ("" where it reads it)."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    builder = FusedAdamBuilder()
    builder.jit_mode = True  # as in a trial's first engine, where FusedAdam is built
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch)
    try:
        builder.compute_capability_args()
        return ""
    except ValueError as e:
        return f"rank 0: ValueError: {e}"


def test_an_architecture_list_deepspeed_cannot_read_names_its_fix(monkeypatch):
    """Seen on a lent H200, whose image sets TORCH_CUDA_ARCH_LIST=9.0a: every trial crashed with
    DeepSpeed's bare ValueError. The fix named must be a list DeepSpeed reads."""
    from zerotune.launch._collect import known_fix

    reason = _deepspeed_arch_error(monkeypatch, "8.0;9.0a")
    assert "invalid literal for int()" in reason
    fixed = known_fix(reason)
    assert fixed.startswith(reason) and "set TORCH_CUDA_ARCH_LIST='8.0;9.0'," in fixed
    assert known_fix(fixed) == fixed
    assert _deepspeed_arch_error(monkeypatch, "8.0;9.0") == ""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the error came from elsewhere: no guess
    assert known_fix(reason) == reason


@pytest.mark.parametrize("layout", ["TORCH_EXTENSIONS_DIR", "default root"])
def test_a_trial_that_never_started_names_a_build_lock_it_may_wait_on(tmp_path, monkeypatch, layout):
    """A killed DeepSpeed op build leaves torch's ``lock`` file; later trials wait on it without
    a word until their timeout. The timeout's reason names the lock (never deleted: a running
    build may hold it). torch builds in ``TORCH_EXTENSIONS_DIR/<op>`` where that is set, else in
    ``<XDG_CACHE_HOME>/torch_extensions/<python>_<device>/<op>``."""
    cache, trial = tmp_path / "ext", tmp_path / "trial"
    trial.mkdir()
    if layout == "TORCH_EXTENSIONS_DIR":
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
        lock = cache / "deepspeed_shm_comm" / "lock"
    else:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        lock = cache / "torch_extensions" / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    assert run(trial, returncode=None, timed_out=True).reason == "no result within the trial timeout of 60 s"
    lock.parent.mkdir(parents=True)
    lock.touch()
    r = run(trial, returncode=None, timed_out=True)
    assert r.state is TrialState.TIMEOUT and str(lock) in r.reason and "delete it" in r.reason and lock.exists()
    (trial / "rank0.progress").write_text("3 0.5\n")  # it trained: the lock is not why it timed out
    assert "lock" not in run(trial, returncode=None, timed_out=True).reason
