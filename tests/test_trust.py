"""Issue 'trust the results': each numbered way the results could be wrong, with the fake launcher."""

import json
import shlex

import pytest

from fakes import FakeLauncher, FakeMachine
from zerotune import Autotuner, ConfigError, load_results
from zerotune.request._config import parse_request
from zerotune.request._space import user_dimensions
from zerotune.trials._trial import TrialSpec, TrialState


# 1. Lists that DeepSpeed reads as lists are values, never dimensions.
def test_optimizer_and_scheduler_lists_pass_through_untouched(tuner_factory, tmp_path):
    opt = {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999]}}
    sched = {"type": "WarmupLR", "params": {"warmup_min_lr": [0, 0.1]}}
    tuner = tuner_factory(
        memory="6GiB", config={"optimizer": opt, "scheduler": sched, "elasticity": {"micro_batch_sizes": [2, 4]}}
    )
    result = tuner.tune()
    assert user_dimensions(tuner.request.space_config) == []
    optimal = json.loads((tmp_path / "results" / "ds_config_optimal.json").read_text())
    assert optimal["optimizer"] == opt and optimal["scheduler"] == sched
    for t in result.trials:
        if t.state is TrialState.OK:
            cfg = json.loads((tmp_path / "results" / t.name / "ds_config.json").read_text())
            assert cfg["optimizer"]["params"]["betas"] == [0.9, 0.999]


def test_a_list_of_lists_is_a_value():
    request = parse_request({"zero_optimization": {"stage": 1}, "custom": {"pairs": [[1, 2], [3, 4]]}}, world_size=1)
    assert user_dimensions(request.space_config) == []


# 6. The order of an offload list never decides which stages are measured.
@pytest.mark.parametrize("devices", [["cpu", "none"], ["none", "cpu"]])
def test_offload_list_order_does_not_prune_stages(tuner_factory, devices):
    tuner = tuner_factory(
        memory="16GiB",
        config={
            "zero_optimization": {
                "stage": "all",
                "offload_param": {"device": devices},
                "offload_optimizer": {"device": devices},
            }
        },
    )
    result = tuner.tune()
    measured = {t.spec.stage for t in result.trials if t.state is TrialState.OK}
    dominated = {t.spec.stage for t in result.trials if t.state is TrialState.PRUNED and "stage 2 fits" in t.reason}
    assert measured == {0, 1, 2} and dominated == {3}  # stage 3: not for its offload, for stage 2's fit
    base3 = tuner.request.base(3)["zero_optimization"]
    assert base3["offload_param"]["device"] == devices[0]
    assert tuner.request.base(0)["zero_optimization"]["offload_optimizer"]["device"] == "none"


# 7. Batch values: coerce what is unambiguous, refuse the rest.
@pytest.mark.parametrize("value", [64.0, "64", " 64 "])
def test_unambiguous_train_batch_size_is_read_as_an_int(value):
    request = parse_request({"train_batch_size": value}, world_size=2)
    assert request.global_batch == 64 and request.space_config["train_batch_size"] == 64


@pytest.mark.parametrize("key", ["train_batch_size", "gradient_accumulation_steps", "train_micro_batch_size_per_gpu"])
@pytest.mark.parametrize("value", ["abc", float("nan"), float("inf"), 2.5, True, -4, 0, 10**12])
def test_bad_batch_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        parse_request({key: value}, world_size=2)


# 8. Trial folder names are safe and unique.
def test_listed_values_never_escape_the_results_folder(tuner_factory, tmp_path):
    outside = tmp_path / "x"
    tuner = tuner_factory(
        memory="6GiB",
        config={
            "tensorboard": {"job_name": ["a", "../../../../" + str(outside), "a/b", "a_b"]},
            "zero_optimization": {"stage": 0},
        },
        autotuning={"fast": False, "tuner_num_trials": 40, "tuner_early_stopping": 40},
    )
    result = tuner.tune()
    root = tmp_path / "results"
    names = [t.name for t in result.trials]
    assert len(names) == len(set(names))
    assert any("../" in str(v) for t in result.trials for _, v in t.spec.overrides)  # the hostile value ran
    assert not outside.exists() and not (tmp_path / "tmp").exists()
    for t in result.trials:
        assert "/" not in t.name and not t.name.startswith(".")
        if t.state is not TrialState.PRUNED:
            assert (root / t.name / "result.json").is_file()
    assert load_results(root).best.name == result.best.name


def test_names_differ_where_the_spec_differs():
    a = TrialSpec(stage=1, micro_batch=2, overrides=(("tensorboard.job_name", "a/b"),))
    b = TrialSpec(stage=1, micro_batch=2, overrides=(("tensorboard.job_name", "a_b"),))
    c = TrialSpec(stage=1, micro_batch=2, overrides=(("zero_optimization.overlap_comm", "on"),))
    d = TrialSpec(stage=1, micro_batch=2, overrides=(("zero_optimization.overlap_comm", True),))
    assert len({a.name, b.name, c.name, d.name}) == 4
    assert d.name == "z1_mb2_gas1_oc=on"  # the common names stay as they were
    long = TrialSpec(stage=1, micro_batch=2, overrides=(("x.y", "v" * 500),))
    assert len(long.name) < 120


# 9. Links are never followed out of the results folder.
def test_overwrite_over_a_symlinked_trial_folder(tuner_factory, tmp_path):
    tuner_factory(memory="6GiB").tune()
    root = tmp_path / "results"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "result.json").write_text("{}")
    (victim / "keep.txt").write_text("mine")
    name = next(p.name for p in root.iterdir() if (p / "result.json").exists())
    import shutil

    shutil.rmtree(root / name)
    (root / name).symlink_to(victim)
    tuner_factory(memory="6GiB", overwrite=True).tune()
    assert (victim / "keep.txt").read_text() == "mine" and (victim / "result.json").read_text() == "{}"
    assert (root / name).is_dir() and not (root / name).is_symlink()


# 2. Resume reuses a trial only when what it measured is unchanged.
def test_another_trial_environment_reruns_every_trial(tmp_path, script, make_config, monkeypatch):
    # On CPU the threads per process and glibc's allocator thresholds set what a trial measures.
    from fakes import FakeLauncher
    from zerotune import Autotuner
    from zerotune.launch._hardware import Node

    def tune():
        tuner = Autotuner(
            [str(script), "--deepspeed_config", str(make_config())],
            num_gpus=2,
            memory_per_device="6GiB",
            launcher=FakeLauncher(),
            node=Node("cpu", 0, 0, 64 * 1024**3),
            results_dir=tmp_path / "r",
        )
        tuner.tune()
        return tuner

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    first = tune()
    assert tune().launcher.jobs == []  # unchanged: every trial reused
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    second = tune()
    assert len(second.launcher.jobs) == len(first.launcher.jobs)
    assert any("because the environment the trials run with changed" in n for n in second.result.notes)


def test_editing_the_script_reruns_every_trial(tuner_factory, script):
    first = tuner_factory(memory="6GiB")
    first.tune()
    script.write_text(script.read_text() + "HIDDEN = 8192\n")
    second = tuner_factory(memory="6GiB")
    second.tune()
    assert len(second.launcher.jobs) == len(first.launcher.jobs)
    assert any("because the script changed" in n for n in second.result.notes)


def test_editing_a_module_the_script_imports_reruns(tuner_factory, script):
    (script.parent / "mymodel.py").write_text("HIDDEN = 512\n")
    script.write_text("import mymodel\n" + script.read_text())
    tuner_factory(memory="6GiB").tune()
    (script.parent / "mymodel.py").write_text("HIDDEN = 8192\n")
    second = tuner_factory(memory="6GiB")
    second.tune()
    assert second.launcher.jobs


def test_moving_the_config_file_reuses_everything(tuner_factory, tmp_path, script, gpu_node):
    first = tuner_factory(memory="6GiB")
    first.tune()
    moved = tmp_path / "elsewhere" / "ds.json"
    moved.parent.mkdir()
    moved.write_text((tmp_path / "ds.json").read_text())
    again = Autotuner(
        [str(script), "--deepspeed_config", str(moved)],
        num_gpus=2,
        memory_per_device="6GiB",
        launcher=FakeLauncher(),
        node=gpu_node,
        results_dir=tmp_path / "results",
    )
    again.tune()
    assert again.launcher.jobs == []
    stored = sum(1 for t in first.result.trials if t.state is not TrialState.PRUNED)
    assert f"{stored} trial(s) on disk in {tmp_path / 'results'}: {stored} reusable" in again.result.notes


def test_failed_trials_retry_when_their_settings_change(tuner_factory):
    machine = FakeMachine(crash={"z1_mb32_gas1"})
    first = tuner_factory(memory="16GiB", machine=machine, trial_timeout=3)
    first.tune()
    assert any(t.state is TrialState.CRASHED for t in first.result.trials)
    same = tuner_factory(memory="16GiB", machine=FakeMachine(), trial_timeout=3)
    same.tune()
    assert same.launcher.jobs == []  # same settings: the failure stands
    longer = tuner_factory(memory="16GiB", machine=FakeMachine(), trial_timeout=600)
    longer.tune()
    assert [j.spec.name for j in longer.launcher.jobs][:1] == ["z1_mb32_gas1"]
    assert all(t.state is not TrialState.CRASHED for t in longer.result.trials)


def test_retry_failed_reruns_failed_trials(tuner_factory):
    tuner_factory(memory="16GiB", machine=FakeMachine(crash={"z1_mb32_gas1"})).tune()
    again = tuner_factory(memory="16GiB", retry_failed=True)
    again.tune()
    assert [j.spec.name for j in again.launcher.jobs][:1] == ["z1_mb32_gas1"]
    assert any("1 because --retry-failed" in n for n in again.result.notes)


# 3. Every reader uses this tuning's record, never stale trials.
def test_readers_ignore_trials_of_an_earlier_tuning(tuner_factory, tmp_path):
    wide = tuner_factory(memory="6GiB", machine=FakeMachine(speed={0: 5.0, 1: 1.1, 2: 1.05, 3: 0.8}))
    wide.tune()
    assert wide.result.best.spec.stage == 0
    narrow = tuner_factory(memory="6GiB", config={"zero_optimization": {"stage": [2, 3]}})
    result = narrow.tune()
    loaded = load_results(tmp_path / "results")
    assert loaded.best.name == result.best.name and loaded.best.spec.stage in (2, 3)
    assert [t.name for t in loaded.trials] == [t.name for t in result.trials]
    from zerotune.report._html import write_report

    page = write_report(tmp_path / "results").read_text()
    assert f"<b>{result.best.name}</b>" in page


def test_a_tuning_without_result_removes_the_old_outputs(tuner_factory, tmp_path):
    tuner_factory(memory="6GiB").tune()
    root = tmp_path / "results"
    assert (root / "ds_config_optimal.json").exists()
    from zerotune import NoFeasibleConfigError

    with pytest.raises(NoFeasibleConfigError):
        tuner_factory(memory="100MiB").tune()
    assert not (root / "ds_config_optimal.json").exists() and not (root / "cmd_optimal.txt").exists()
    assert "best: none" in (root / "summary.txt").read_text()
    assert load_results(root).best is None


def test_an_interrupted_tuning_leaves_no_earlier_choice_beside_its_record(tuner_factory, tmp_path):
    tuner_factory(memory="6GiB").tune()
    root = tmp_path / "results"
    with pytest.raises(KeyboardInterrupt):
        tuner_factory(
            memory="6GiB", launcher=FakeLauncher(interrupt_at=0), config={"zero_optimization": {"stage": [2, 3]}}
        ).tune()
    assert not (root / "ds_config_optimal.json").exists() and not (root / "summary.txt").exists()
    assert json.loads((root / "tuning.json").read_text())["state"] == "interrupted"


# 4. A second tune() on the same object resumes from a fresh state.
def test_second_tune_on_the_same_object_resumes(tuner_factory, tmp_path):
    tuner = tuner_factory(memory="6GiB")
    first = tuner.tune()
    launched = len(tuner.launcher.jobs)
    second = tuner.tune()
    assert len(tuner.launcher.jobs) == launched
    assert second.best.name == first.best.name and len(second.trials) == len(first.trials)
    assert len(json.loads((tmp_path / "results" / "results.json").read_text())["trials"]) == len(first.trials)


# 5. Multi-node: the final command uses the tuning's topology.
def test_multinode_command_names_every_host(tmp_path, script, make_config, gpu_node):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        hostfile=hostfile,
        memory_per_device="6GiB",
        results_dir=tmp_path / "r",
        launcher=FakeLauncher(),
        node=gpu_node,
    )
    result = tuner.tune()
    assert tuner.world == 4 and result.best_config["train_batch_size"] == 64
    words = shlex.split((tmp_path / "r" / "cmd_optimal.txt").read_text(), comments=True)
    assert words[0] == "deepspeed" and f"--hostfile={hostfile.resolve()}" in words
    assert "--include=worker-0:0,1@worker-1:0,1" in words and "--num_gpus" not in words


def test_multinode_torchrun_command_runs_on_each_node(tmp_path, script, make_config, gpu_node):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        hostfile=hostfile,
        multinode_launcher="torchrun",
        memory_per_device="6GiB",
        results_dir=tmp_path / "r",
        launcher=FakeLauncher(),
        node=gpu_node,
    )
    tuner.tune()
    text = (tmp_path / "r" / "cmd_optimal.txt").read_text()
    assert "worker-0 worker-1" in text and "--nnodes=2" in text and "--node-rank=${NODE_RANK}" in text


def test_run_after_tuning_starts_on_the_tuned_topology(tmp_path, script, make_config, gpu_node):
    class Recording(FakeLauncher):
        def run_program(self, probe_spec, num_gpus, extra_env, program=None):
            self.ran = (json.loads(probe_spec.read_text()), num_gpus)
            return 0

    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    launcher = Recording()
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        hostfile=hostfile,
        memory_per_device="6GiB",
        results_dir=tmp_path / "r",
        launcher=launcher,
        node=gpu_node,
    )
    tuner.tune()
    assert tuner.run_after_tuning() == 0
    spec, num_gpus = launcher.ran
    assert spec["mode"] == "run" and num_gpus == 2 and tuner.cluster.num_nodes == 2


# 11. Oversized numbers are refused before anything is built from them.
@pytest.mark.parametrize(
    "kw, match",
    [
        ({"trial_timeout": float("nan")}, "trial_timeout"),
        ({"stall_timeout": float("inf")}, "stall_timeout"),
        ({"memory": "1e400GB"}, "memory-per-device"),
        ({"precision": float("nan")}, "precision"),
    ],
)
def test_absurd_settings_are_refused(tuner_factory, kw, match):
    with pytest.raises(ConfigError, match=match):
        tuner_factory(**kw)


def test_a_billion_processes_are_refused_before_anything_is_built(tmp_path, script, make_config):
    from zerotune.launch._hardware import Node

    with pytest.raises(ConfigError, match="--num-gpus 1000000000 is out of range"):
        Autotuner(
            [str(script), "--deepspeed_config", str(make_config())],
            num_gpus=1_000_000_000,
            node=Node("cpu", 0, None, 8 * 1024**3),
            launcher=FakeLauncher(),
            results_dir=tmp_path / "r",
        )


@pytest.mark.parametrize("autotuning", [{"max_train_micro_batch_size_per_gpu": 1e11}, {"max_train_batch_size": 10**15}])
def test_absurd_autotuning_sizes_are_refused(tuner_factory, autotuning):
    with pytest.raises(ConfigError, match="less than or equal"):
        tuner_factory(autotuning=autotuning)


def test_absurd_hostfile_slots_are_refused(tmp_path):
    from zerotune.launch._hosts import read_hostfile

    path = tmp_path / "hosts"
    path.write_text("worker-0 slots=100000000000\n")
    with pytest.raises(ConfigError, match="slots"):
        read_hostfile(path)
    path.write_bytes(b"w\xff slots=2\n")
    with pytest.raises(ConfigError, match="hostfile"):
        read_hostfile(path)
