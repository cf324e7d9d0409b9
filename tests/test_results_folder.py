"""The results folder: zerotune writes only into its own, --overwrite removes only what it made,
one tuning holds a folder at a time, and `zerotune show` tells an unfinished tuning apart."""

import json
import os
import subprocess
import sys

import pytest

from hostile import run_cli
from zerotune import ZerotuneError, load_results
from zerotune.results._folder import LOCK, FolderBusyError, FolderLock, busy, claim, expand


def test_overwrite_removes_only_the_trial_folders_and_outputs_zerotune_made(tuner_factory, tmp_path):
    root = tmp_path / "results"
    first = tuner_factory(memory="6GiB").tune()
    data = root / "data"  # a user's folder that happens to hold files named like zerotune's
    data.mkdir()
    (data / "result.json").write_text("{}")
    (data / "probe.json").write_text("{}")
    (data / "weights.bin").write_bytes(b"w")
    (root / "notes.md").write_text("mine")
    made = json.loads((root / "tuning.json").read_text())["made"]
    assert made and set(made) >= {t.name for t in first.trials if (root / t.name).is_dir()}
    tuner_factory(memory="6GiB", overwrite=True).tune()
    assert (data / "weights.bin").read_bytes() == b"w" and (data / "result.json").exists()
    assert (root / "notes.md").read_text() == "mine"
    # The user's folder is never read as a trial: no "damaged" note names it.
    assert not any("data" in n for n in load_results(root).notes)


def test_overwrite_of_a_python_api_string_is_refused_before_anything_is_deleted(tuner_factory, tmp_path):
    tuner_factory(memory="6GiB").tune()
    before = sorted(p.name for p in (tmp_path / "results").iterdir())
    with pytest.raises(ValueError, match="overwrite"):
        tuner_factory(memory="6GiB", overwrite="no")
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == before


@pytest.mark.parametrize(
    "argument, value",
    [
        ("overwrite", "no"),
        ("warm_trials", "no"),
        ("num_gpus", "2"),
        ("num_gpus", 2.5),
        ("retry_failed", 1),
        ("on_event", 5),
        ("trial_timeout", "10"),
        ("max_concurrent_trials", True),
    ],
)
def test_python_api_arguments_are_checked_once_and_named(tmp_path, script, make_config, gpu_node, argument, value):
    from fakes import FakeLauncher
    from zerotune import Autotuner

    given = {
        "num_gpus": 2,
        "results_dir": tmp_path / "r",
        "launcher": FakeLauncher(),
        "node": gpu_node,
        argument: value,
    }
    with pytest.raises(ValueError, match=f"{argument}=") as info:
        Autotuner([str(script), "--deepspeed_config", str(make_config())], **given)
    assert isinstance(info.value, ZerotuneError) and not (tmp_path / "r").exists()


def test_a_command_given_as_one_string_is_refused(tmp_path):
    from zerotune import Autotuner

    with pytest.raises(ValueError, match="command"):
        Autotuner("python train.py --deepspeed_config ds.json", results_dir=tmp_path / "r")


def test_a_folder_that_is_not_zerotunes_is_refused_and_kept(tuner_factory, tmp_path):
    root = tmp_path / "results"
    root.mkdir()
    for name in ("summary.txt", "results.json", "cmd_optimal.txt"):
        (root / name).write_text("the user's")
    (root / "data").mkdir()
    (root / "data" / "result.json").write_text("{}")
    with pytest.raises(ZerotuneError, match="not zerotune's.*cmd_optimal.txt.*zerotune_results"):
        tuner_factory(memory="6GiB")
    assert all((root / n).read_text() == "the user's" for n in ("summary.txt", "results.json", "cmd_optimal.txt"))
    assert sorted(p.name for p in root.iterdir()) == ["cmd_optimal.txt", "data", "results.json", "summary.txt"]


def test_the_cli_refuses_a_foreign_folder_with_one_message(tmp_path):
    from hostile import CONFIG, SCRIPT

    box = tmp_path / "box"
    (box / "mine").mkdir(parents=True)
    (box / "mine" / "summary.txt").write_text("keep")
    (box / "train.py").write_text(SCRIPT)
    (box / "ds.json").write_text(json.dumps(CONFIG))
    out = run_cli(
        ["tune", "--num-gpus", "2", "--results-dir", "mine", "train.py", "--deepspeed_config", "ds.json"],
        box,
        box / "elsewhere",
    )
    assert out.code == 2 and not out.traceback and out.err.count("\n") == 1, out.err
    assert "not zerotune's" in out.err and "summary.txt" in out.err
    assert (box / "mine" / "summary.txt").read_text() == "keep" and not out.escaped


def test_empty_new_and_own_folders_are_accepted(tmp_path):
    assert claim(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert claim(tmp_path / "empty") is None
    own = tmp_path / "own"
    own.mkdir()
    (own / "tuning.json").write_text(json.dumps({"zerotune": "0.1.0", "trials": []}))
    assert claim(own) == {"zerotune": "0.1.0", "trials": []}
    (own / "tuning.json").write_text("{damaged")  # a damaged record beside zerotune's lock is still its own
    (own / LOCK).touch()
    assert claim(own) == {"made": []}
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "tuning.json").write_text(json.dumps({"mine": 1}))  # someone else's tuning.json
    with pytest.raises(ZerotuneError, match="not zerotune's"):
        claim(alone)


def test_a_second_tuning_of_the_same_folder_is_refused_with_the_first_ones_pid(tuner_factory, tmp_path):
    root = tmp_path / "results"
    tuner_factory(memory="6GiB").tune()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom zerotune.results._folder import FolderLock\n"
            "lock = FolderLock(__import__('pathlib').Path(sys.argv[1]))\nlock.acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(600)",
            str(root),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        record = json.loads((root / "tuning.json").read_text())
        (root / "tuning.json").write_text(json.dumps({**record, "pid": holder.pid, "state": "running"}))
        assert busy(root)
        with pytest.raises(FolderBusyError, match=f"pid {holder.pid}"):
            tuner_factory(memory="6GiB").tune()
        assert load_results(root).state == "running"
        assert f"in progress: a tuning (pid {holder.pid})" in load_results(root).state_line()
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the dead holder's lock: the folder reads as interrupted, and tunes again.
    assert not busy(root)
    assert load_results(root).state == "interrupted"
    assert tuner_factory(memory="6GiB").tune().best is not None


def test_show_of_an_interrupted_tuning_says_so_and_lists_only_files_that_exist(tuner_factory, tmp_path):
    from hostile import run_cli

    root = tmp_path / "results"
    tuner = tuner_factory(memory="6GiB")
    tuner.tune()
    record = json.loads((root / "tuning.json").read_text())
    (root / "tuning.json").write_text(json.dumps({**record, "state": "interrupted"}))
    for name in ("summary.txt", "ds_config_optimal.json", "cmd_optimal.txt"):
        (root / name).unlink()
    out = run_cli(["show", str(root)], tmp_path, root)
    assert out.code == 0, out.err + out.traceback
    text = " ".join(out.out.split())
    assert "interrupted after" in text and "rerun the same tuning command to resume" in text
    assert "no configuration succeeded" not in text and "cmd_optimal.txt" not in text


def test_home_and_variables_in_a_results_folder_are_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RUNS", "runs")
    assert expand("~/r") == tmp_path / "r"
    assert expand("$HOME/$RUNS") == tmp_path / "runs"
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    with pytest.raises(ZerotuneError, match="not set"):
        expand("$NOT_SET_HERE/r")


def test_the_lock_is_released_when_the_tuning_ends(tmp_path):
    with FolderLock(tmp_path):
        assert busy(tmp_path)
    assert not busy(tmp_path)
    assert os.path.exists(tmp_path / LOCK)


def test_trials_that_time_out_are_never_called_a_memory_problem(tuner_factory):
    from fakes import FakeMachine
    from zerotune import NoFeasibleConfigError

    tuner = tuner_factory(memory="12GiB", machine=FakeMachine(hang={0, 1, 2, 3}))
    with pytest.raises(NoFeasibleConfigError) as info:
        tuner.tune()
    message = str(info.value)
    assert "--trial-timeout" in message and "memory" not in message, message
    notes = " ".join(tuner.record.notes)
    assert "finished in time" in notes and "fits the budget" not in notes


def test_a_time_budget_spent_before_any_trial_is_named(tmp_path):
    from zerotune.results._result import no_choice_message

    message = no_choice_message([], tmp_path, 0.001)
    assert message.startswith("no trial ran: the time budget of 0.001 s") and "--time-budget" in message
    assert "memory" not in message


def test_a_damaged_record_is_rebuilt_and_its_trials_reused(tuner_factory, tmp_path):
    root = tmp_path / "results"
    first = tuner_factory(memory="6GiB").tune()
    (root / "tuning.json").write_text("{truncated")
    second = tuner_factory(memory="6GiB")
    again = second.tune()
    assert again.best.name == first.best.name
    assert any(e.kind == "reused" for e in second.events) and second.record.launched == 0


def test_show_ends_what_a_killed_tuning_left_running_and_says_so(tuner_factory, tmp_path):
    from procs import sleeper

    tuner_factory(memory="6GiB").tune()
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = sleeper("results", str(dead.pid), cwd=tmp_path)  # the folder as a relative path, as the default
    try:
        out = run_cli(["show", "results"], tmp_path, tmp_path / "results")
        assert out.code == 0, out.err + out.traceback
        assert left.wait(timeout=30) == -9
        assert f"ended 1 process(es) that an earlier, killed tuning of this folder left running: {left.pid}" in out.err
    finally:
        left.kill()
        left.wait()
