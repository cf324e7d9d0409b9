"""The tuning loop with the fake launcher: outputs, resume, interruption, events, the API."""

import json
import shlex
import subprocess
import sys

import pytest

from fakes import FakeLauncher
from zerotune import Autotuner, load_results
from zerotune.trials._trial import TrialState


def test_outputs(tuner_factory, tmp_path):
    tuner = tuner_factory(memory="6GiB")
    result = tuner.tune()
    root = tmp_path / "results"
    optimal = json.loads((root / "ds_config_optimal.json").read_text())
    assert "autotuning" not in optimal
    assert optimal["zero_optimization"]["stage"] == result.best.spec.stage
    assert optimal["train_micro_batch_size_per_gpu"] == result.best.spec.micro_batch
    assert optimal["train_batch_size"] == 64
    assert (root / "ds_config_optimal.json").read_text().startswith("{\n  ")  # indented
    cmd = (root / "cmd_optimal.txt").read_text()
    assert "base64" not in cmd and "hostfile" not in cmd
    words = shlex.split(cmd)
    assert words[words.index("--deepspeed_config") + 1] == str((root / "ds_config_optimal.json").resolve())
    summary = (root / "summary.txt").read_text()
    assert f"best: {result.best.name}" in summary and "why not chosen" in summary
    for t in result.trials:
        if t.state is not TrialState.PRUNED:
            assert (root / t.name / "ds_config.json").exists() and (root / t.name / "result.json").exists()


def test_command_is_quoted_for_the_shell(tmp_path, make_config, gpu_node):
    script = tmp_path / "my dir" / "train $x.py"
    script.parent.mkdir()
    script.write_text("# local_rank\n")
    cfg = make_config()
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(cfg), "--name", "a b;c"],
        num_gpus=2,
        memory_per_device="6GiB",
        results_dir=tmp_path / "r",
        launcher=FakeLauncher(),
        node=gpu_node,
    )
    tuner.tune()
    words = shlex.split((tmp_path / "r" / "cmd_optimal.txt").read_text())
    assert str(script) in words and "a b;c" in words


def test_rerun_resumes_without_relaunching(tuner_factory):
    first = tuner_factory(memory="6GiB")
    r1 = first.tune()
    second = tuner_factory(memory="6GiB")
    r2 = second.tune()
    assert second.launcher.jobs == []
    assert r2.best.name == r1.best.name and len(r2.trials) == len(r1.trials)
    assert {e.kind for e in second.events} >= {"reused"}


def test_overwrite_starts_fresh(tuner_factory):
    tuner_factory(memory="6GiB").tune()
    again = tuner_factory(memory="6GiB", autotuning={"overwrite": True})
    again.tune()
    assert again.launcher.jobs


def test_changed_inputs_are_not_reused(tuner_factory):
    tuner_factory(memory="6GiB").tune()
    other = tuner_factory(memory="7GiB")  # another budget: earlier trials do not count
    other.tune()
    assert other.launcher.jobs


def test_interrupt_keeps_finished_trials_and_rerun_resumes(tuner_factory, tmp_path):
    full = tuner_factory(memory="6GiB", results_dir=tmp_path / "full")
    full.tune()
    total = len(full.launcher.jobs)
    interrupted = tuner_factory(memory="6GiB", launcher=FakeLauncher(interrupt_at=3))
    with pytest.raises(KeyboardInterrupt):
        interrupted.tune()
    assert interrupted.launcher.closed
    assert json.loads((tmp_path / "results" / "tuning.json").read_text())["state"] == "interrupted"
    launched = [
        p
        for p in (tmp_path / "results").glob("*/result.json")
        if json.loads(p.read_text())["result"]["state"] != "pruned"
    ]
    assert len(launched) == 3
    resumed = tuner_factory(memory="6GiB")
    resumed.tune()
    assert len(resumed.launcher.jobs) == total - 3


def test_events_reach_the_caller(tuner_factory):
    tuner = tuner_factory(memory="6GiB")
    tuner.tune()
    kinds = [e.kind for e in tuner.events]
    assert kinds.count("started") == kinds.count("finished") == len(tuner.launcher.jobs)
    assert "best" in kinds


def test_load_results_reads_a_finished_run(tuner_factory, tmp_path):
    result = tuner_factory(memory="6GiB").tune()
    loaded = load_results(tmp_path / "results")
    assert loaded.best.name == result.best.name
    assert loaded.best_config == result.best_config
    assert loaded.why_lost(loaded.best) == "chosen"


def test_write_optimal_config(tuner_factory, tmp_path):
    tuner = tuner_factory(memory="6GiB")
    tuner.tune()
    path = tuner.write_optimal_config(tmp_path / "best.json")
    assert json.loads(path.read_text()) == tuner.result.best_config


def test_import_is_lazy():
    code = (
        "import sys, zerotune, zerotune.cli; print(any(m in sys.modules for m in ('torch', 'deepspeed', 'lightning')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_offload_is_searched_where_nothing_fits_without_it(tuner_factory, tmp_path):
    tuner = tuner_factory(memory="2GiB")  # stage 3 alone needs 2000 MiB + 100 MiB per sample
    result = tuner.tune()
    offloaded = [t for t in result.trials if t.spec.overrides]
    assert offloaded and result.best in offloaded and "_oo=cpu" in result.best.name
    assert all(t.spec.stage >= 1 for t in offloaded)
    assert all(("_op=cpu" in t.name) == (t.spec.stage == 3) for t in offloaded)  # params only with stage 3
    assert any("nothing fit without offload" in n for n in result.notes)
    best = json.loads((tmp_path / "results" / "ds_config_optimal.json").read_text())
    assert best["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


def test_offload_not_searched_when_a_config_fits_or_when_refused(tuner_factory, tmp_path):
    from zerotune import NoFeasibleConfigError

    assert not any(t.spec.overrides for t in tuner_factory().tune().trials)
    with pytest.raises(NoFeasibleConfigError):
        tuner_factory(memory="2GiB", offload=False, results_dir=tmp_path / "r2").tune()
    forced = tuner_factory(offload=True, results_dir=tmp_path / "r3").tune()
    assert any(t.spec.overrides for t in forced.trials) and any(not t.spec.overrides for t in forced.trials)


def test_a_full_disk_is_a_clear_error_that_loses_nothing(tuner_factory, monkeypatch, tmp_path):
    import errno
    import pathlib

    from zerotune import ZerotuneError

    real = pathlib.Path.write_text
    writes = {"n": 0}

    def filling(self, text, *a, **kw):
        if self.name.endswith(".tmp"):
            writes["n"] += 1
            if writes["n"] > 12:  # the disk fills up half-way through a file
                real(self, text[: len(text) // 2], *a, **kw)
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", filling)
    tuner = tuner_factory(results_dir=tmp_path / "results")
    with pytest.raises(ZerotuneError, match="No space left on device.*free some space"):
        tuner.tune()
    monkeypatch.setattr(pathlib.Path, "write_text", real)
    root = tmp_path / "results"
    assert not list(root.rglob("*.tmp"))  # nothing half-written
    finished = {p.parent.name for p in root.glob("*/result.json")}
    for p in root.glob("*/*.json"):
        json.loads(p.read_text())  # every file whole
    assert finished
    again = tuner_factory(results_dir=root)
    again.tune()
    assert not finished & {j.spec.name for j in again.launcher.jobs}  # resumed, nothing rerun


def test_warm_up_adapts_unless_start_profile_step_is_given(tuner_factory, tmp_path):
    adaptive = tuner_factory()
    adaptive.tune()
    assert all(j.adaptive_warmup and j.probe_spec(j.trial_dir)["adaptive_warmup"] for j in adaptive.launcher.jobs)
    fixed = tuner_factory({"start_profile_step": 4, "end_profile_step": 8}, results_dir=tmp_path / "fixed")
    fixed.tune()
    assert all(not j.adaptive_warmup and j.warmup_steps == 3 for j in fixed.launcher.jobs)
    assert adaptive.trials.identity().measure["warmup"] == "adaptive"
    assert fixed.trials.identity().measure["warmup"] == "fixed"


def test_the_time_budget_has_one_name_and_the_old_one_warns(tuner_factory):
    assert tuner_factory(time_budget="20m").time_budget == 1200
    with pytest.warns(FutureWarning, match="time_budget"):
        assert tuner_factory(budget="20m").time_budget == 1200
    with pytest.raises(ValueError, match="one setting"):
        tuner_factory(budget="20m", time_budget="10m")


POLICY = {
    "max_measure_seconds": 6.0,
    "remeasure_seconds": 3.0,
    "remeasure_rounds": 1,
    "max_steps": 20,
    "max_warmup_steps": 4,
    "precision": 0.05,
    "trial_timeout": 300.0,
    "stall_timeout": 60.0,
}
"""One value for each field of the measurement policy, under the name every face gives it."""


def test_the_measurement_policy_has_the_same_names_on_every_face(tuner_factory):
    import inspect

    from zerotune.cli._parsers import tune_parser
    from zerotune.trials._settings import MeasureSettings

    argv = [x for name, value in POLICY.items() for x in ("--" + name.replace("_", "-"), str(value))]
    parsed = vars(tune_parser("tune").parse_args(argv))
    assert {name: parsed[name] for name in POLICY} == POLICY  # the CLI
    pytest.importorskip("lightning")
    from zerotune.lightning import AutotuneDeepSpeedStrategy

    assert set(POLICY) <= set(inspect.signature(AutotuneDeepSpeedStrategy.__init__).parameters)  # the strategy
    assert AutotuneDeepSpeedStrategy(**POLICY).tuning.measure == POLICY
    from fakes import FakeMachine

    tuner = tuner_factory(  # the Python API; two stages within noise, so that they are measured again
        machine=FakeMachine(speed={1: 1.02, 2: 1.0}, rel_ci=0.05),
        config={"zero_optimization": {"stage": [1, 2]}, "train_micro_batch_size_per_gpu": 8},
        **POLICY,
    )
    assert tuner.measure == MeasureSettings(**POLICY)
    tuner.tune()
    trials = [j for j in tuner.launcher.jobs if j.window_seconds is None]
    spec = trials[0].probe_spec(trials[0].trial_dir)
    assert (spec["max_seconds"], spec["max_steps"], spec["max_warmup"], spec["rel_ci"]) == (6.0, 20, 4, 0.05)
    confirms = [j for j in tuner.launcher.jobs if j.window_seconds is not None]
    assert confirms and all(j.window_seconds == 3.0 for j in confirms)
    assert all(j.trial_dir.name == "confirm1" for j in confirms)  # one round at most


def test_the_tuning_keeps_time_on_the_launcher_s_clock(tuner_factory):
    # A launcher whose trials take 1,000 s each on its own (virtual) clock: the time budget of
    # 2,500 s stops the search after three, and the tuning's wall time is that clock's.
    from fakes import FakeLauncher

    class Virtual(FakeLauncher):
        clock = 0.0

        def now(self):
            return self.clock

        def run(self, job):
            self.clock += 1000.0
            return super().run(job)

    launcher = Virtual()
    result = tuner_factory(launcher=launcher, time_budget=2500).tune()
    assert len(launcher.jobs) == 3 and "stopped at the time budget of 2500 s" in result.notes
    assert result.cost.total_time == pytest.approx(3000.0)
