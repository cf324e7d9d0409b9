"""Bad input: one clear message, exit status 2, no traceback."""

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}


def zerotune(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "zerotune.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=60,
    )


def write(path, data):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    "config, message",
    [
        ('{"autotuning": {"fast": true,,}}', "not valid JSON"),  # one trailing comma DeepSpeed's reader allows
        ({"autotuning": {"metrik": "latency"}}, "autotuning.metrik: unknown key; did you mean 'metric'"),
        ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage: 5 is not a ZeRO stage"),
        (
            {"autotuning": {"min_train_micro_batch_size_per_gpu": 8, "max_train_micro_batch_size_per_gpu": 2}},
            "is above max_train_micro_batch_size_per_gpu",
        ),
        ({"autotuning": {"max_train_batch_size": 7}}, "cannot be split over 2 data-parallel processes"),
        ({"train_micro_batch_size_per_gpu": "big"}, "train_micro_batch_size_per_gpu"),
    ],
)
def test_bad_config(tmp_path, script, config, message):
    cfg = write(tmp_path / "ds.json", config)
    out = zerotune("tune", "--num-gpus", 2, script, "--deepspeed_config", cfg)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and out.stderr.startswith("zerotune: error:")
    assert "Traceback" not in out.stderr


def test_missing_script(tmp_path):
    out = zerotune("tune", tmp_path / "nope.py", "--deepspeed_config", "ds.json")
    assert out.returncode == 2 and "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_missing_config_flag(script):
    out = zerotune("tune", script, "--lr", "1")
    assert out.returncode == 2 and "add --deepspeed_config" in out.stderr


def test_bad_memory_size(tmp_path, script):
    cfg = write(tmp_path / "ds.json", {})
    out = zerotune("tune", "--memory-per-device", "lots", script, "--deepspeed_config", cfg)
    assert out.returncode == 2 and "--memory-per-device: cannot read 'lots' as a size" in out.stderr


def test_show_on_a_folder_without_results(tmp_path):
    out = zerotune("show", tmp_path)
    assert out.returncode == 2 and "holds no zerotune results" in out.stderr


def test_report_and_show_read_a_tuning_without_rerunning_it(tmp_path, make_config, gpu_node, script):
    from fakes import FakeLauncher
    from zerotune import Autotuner

    res = tmp_path / "results"
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        num_gpus=2,
        memory_per_device="5GiB",
        launcher=FakeLauncher(),
        node=gpu_node,
        results_dir=res,
    )
    result = tuner.tune()
    out = zerotune("report", res)
    assert out.returncode == 0 and out.stdout.strip() == str(res / "report.html")
    assert (res / "report" / "throughput.png").exists()
    shown = zerotune("show", res)
    assert shown.returncode == 0 and result.best.name in shown.stdout
    assert zerotune("report", tmp_path).returncode == 2


def test_no_script(tmp_path):
    out = zerotune("tune", "--num-gpus", "2")
    assert out.returncode == 2 and "no training script" in out.stderr


def test_help_is_instant_and_lists_commands():
    out = zerotune("--help")
    assert out.returncode == 0 and all(c in out.stdout for c in ("tune", "run", "show", "report", "estimate"))


def test_each_command_has_its_own_help_and_there_is_a_version():
    from zerotune import __version__

    tune = zerotune("tune", "--help")
    assert tune.returncode == 0 and "--memory-per-device" in tune.stdout and "accelerate launch" in tune.stdout
    assert "--params" not in tune.stdout and "--hf-config" not in tune.stdout
    estimate = zerotune("estimate", "--help")
    assert estimate.returncode == 0 and "--params" in estimate.stdout and "--memory-per-device" not in estimate.stdout
    show = zerotune("show", "--help")
    assert show.returncode == 0 and "RESULTS_DIR" in show.stdout and "--num-gpus" not in show.stdout
    version = zerotune("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"zerotune {__version__}"
    unknown = zerotune("tuen", "train.py")
    assert unknown.returncode == 2 and "unknown command 'tuen'" in unknown.stderr and "Traceback" not in unknown.stderr


def test_script_arguments_are_not_parsed_by_zerotune():
    from zerotune.cli._parsers import split_argv

    own, cmd = split_argv(["tune", "--num-gpus", "2", "train.py", "--n", "3", "--num-gpus", "9", "--help"])
    assert own == ["tune", "--num-gpus", "2"]
    assert cmd == ["train.py", "--n", "3", "--num-gpus", "9", "--help"]


def test_every_option_that_takes_a_value_keeps_it_from_the_script():
    from zerotune.cli._parsers import split_argv, tune_parser

    parser = tune_parser("tune")
    for action in parser._actions:
        for flag in action.option_strings:
            if action.nargs != 0:
                own, cmd = split_argv(["tune", flag, "stage,1", "train.py", "--x"])
                assert own == ["tune", flag, "stage,1"] and cmd == ["train.py", "--x"], flag


def test_a_launcher_in_place_of_the_script_is_one_clear_error(tmp_path):
    for launcher in ("deepspeed", "accelerate", "torchrun"):
        out = zerotune("tune", launcher, "--num_gpus", "2", "train.py")
        assert out.returncode == 2 and f"not the {launcher} launcher" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("where", ["--tensorboard", "--results-dir", "script"])
def test_a_nul_byte_in_an_argument_is_one_clear_error(tmp_path, monkeypatch, capsys, where):
    # No shell can pass one; a program calling main() can.
    from zerotune import cli

    monkeypatch.chdir(tmp_path)
    bad = "runs\0x"
    argv = [
        "tune",
        *([where, bad] if where != "script" else []),
        bad if where == "script" else "train.py",
        "--deepspeed_config",
        "ds.json",
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "contains a NUL byte" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("argv", [["--help"], ["tune", "--help"]], ids=" ".join)
def test_a_reader_that_went_away_ends_the_output_quietly(argv):
    # `zerotune --help | head -1`: the pipe's reader is gone before the help is written.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "zerotune", *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode in (0, 1)  # argparse itself ignores the broken pipe
