"""Bad input to `zerotune tune` and `estimate`: one message naming the problem and the fix, exit
status 2, never a traceback, nothing written outside the results folder."""

import json
import os
import subprocess
import sys

import pytest

from hostile import CONFIG, SCRIPT, run_cli


@pytest.fixture
def box(tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    (box / "train.py").write_text(SCRIPT)
    (box / "ds.json").write_text(json.dumps(CONFIG))
    return box


def tune(box, *command, options=()):
    return run_cli(
        ["tune", "--quiet", "--num-gpus", "2", "--results-dir", "results", *options, *command], box, box / "results"
    )


def refused(outcome, *words):
    assert not outcome.traceback, outcome.traceback
    assert outcome.code == 2 and outcome.err.startswith("zerotune: error:") and outcome.err.count("\n") == 1, (
        outcome.err
    )
    assert not outcome.escaped, outcome.escaped
    for word in words:
        assert word in outcome.err, outcome.err


def test_the_config_option_given_twice_is_refused(box):
    (box / "b.json").write_text(json.dumps(CONFIG))
    refused(
        tune(box, "train.py", "--deepspeed_config", "ds.json", "--deepspeed_config=b.json"),
        "given 2 times",
        "ds.json",
        "b.json",
    )


def test_duplicate_keys_are_refused_as_deepspeed_refuses_them(box):
    (box / "ds.json").write_text('{"train_batch_size": 8, "train_batch_size": 16, "zero_optimization": {"stage": 1}}')
    refused(tune(box, "train.py", "--deepspeed_config", "ds.json"), "duplicate keys ['train_batch_size']")


def test_comments_are_read_as_deepspeed_reads_them(box):
    text = json.dumps(CONFIG, indent=1)
    (box / "ds.json").write_text(
        "// tuned nightly\n" + text.replace('"zero_optimization"', '# stages\n"zero_optimization"')
    )
    out = tune(box, "train.py", "--deepspeed_config", "ds.json")
    assert out.code == 0, out.err + out.traceback


def test_batch_values_that_disagree_are_refused(box):
    (box / "ds.json").write_text(
        json.dumps({"train_batch_size": 64, "gradient_accumulation_steps": 3, "train_micro_batch_size_per_gpu": 4})
    )
    refused(
        tune(box, "train.py", "--deepspeed_config", "ds.json"),
        "train_batch_size 64",
        "(24)",
        "which DeepSpeed requires",
    )


@pytest.mark.parametrize("what", ["script", "ds_config"])
def test_a_folder_or_a_pipe_is_named_as_such(box, what):
    (box / "folder.py").mkdir()
    os.mkfifo(box / "pipe.py")
    for path, words in (("folder.py", "is a folder"), ("pipe.py", "not a regular file")):
        command = (
            [path, "--deepspeed_config", "ds.json"] if what == "script" else ["train.py", "--deepspeed_config", path]
        )
        refused(tune(box, *command), words)


def test_a_double_dash_before_the_script_is_read_as_the_end_of_options(box):
    out = run_cli(
        [
            "tune",
            "--quiet",
            "--num-gpus",
            "2",
            "--results-dir",
            "results",
            "--",
            "train.py",
            "--deepspeed_config",
            "ds.json",
        ],
        box,
        box / "results",
    )
    assert out.code == 0, out.err + out.traceback


def test_a_home_folder_in_the_results_folder_is_expanded(box, monkeypatch):
    monkeypatch.setenv("HOME", str(box / "home"))
    out = run_cli(
        ["tune", "--quiet", "--num-gpus", "2", "--results-dir", "~/runs", "train.py", "--deepspeed_config", "ds.json"],
        box,
        box / "home" / "runs",
    )
    assert out.code == 0, out.err + out.traceback
    assert (box / "home" / "runs" / "tuning.json").exists() and not (box / "~").exists()


def test_deep_and_huge_config_files_are_refused_before_parsing(box):
    (box / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(tune(box, "train.py", "--deepspeed_config", "deep.json"), "nests 100000 levels")
    with open(box / "huge.json", "wb") as f:
        f.truncate(4 << 30)  # 4 GB, sparse: nothing is read past the bound
    refused(tune(box, "train.py", "--deepspeed_config", "huge.json"), "over 1 MiB")
    hf = box / "config.json"
    hf.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    refused(run_cli(["estimate", "--hf-config", str(hf)], box, box / "results"), "nests")


def test_an_impossible_model_size_is_named(box):
    hf = box / "config.json"
    hf.write_text('{"hidden_size": 1e400, "num_hidden_layers": 2, "vocab_size": 100}')
    refused(run_cli(["estimate", "--hf-config", str(hf)], box, box / "results"), "hidden_size is Infinity")


def test_a_deep_python_dict_is_a_config_error():
    from zerotune import ConfigError
    from zerotune.request._config import load_ds_config

    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ConfigError, match="nests deeper"):
        load_ds_config(deep)


PROBE_SCRIPTS = {
    "exit_message": (
        "import sys\nsys.exit('custom failure message')\n",
        "exited with status 1 and the message 'custom failure message'",
    ),
    "no_engine": ("print('no training here')\n", "without calling deepspeed.initialize"),
}


@pytest.mark.parametrize("case", sorted(PROBE_SCRIPTS))
def test_how_a_script_ended_is_said_as_it_happened(tmp_path, case):
    source, expected = PROBE_SCRIPTS[case]
    script = tmp_path / "s.py"
    script.write_text(source)
    out = tmp_path / "trial"
    out.mkdir()
    spec = {
        "mode": "measure",
        "script": str(script),
        "args": [],
        "local_rank_arg": False,
        "out_dir": str(out),
        "results_dir": str(tmp_path),
        "budget": None,
        "warmup_steps": 1,
        "adaptive_warmup": False,
        "min_steps": 3,
        "max_steps": 10,
        "max_seconds": 5.0,
        "rel_ci": 0.03,
        "to_beat": None,
        "settle": None,
        "expect": {"stage": 0, "micro_batch": 1, "grad_accum": 1},
    }
    (out / "probe.json").write_text(json.dumps(spec))
    env = {**os.environ, "ZEROTUNE_PROBE": str(out / "probe.json"), "DS_ACCELERATOR": "cpu"}
    subprocess.run([sys.executable, "-m", "zerotune.probe"], env=env, timeout=300, capture_output=True)
    rank = json.loads((out / "rank0.json").read_text())
    assert rank["state"] == "crashed" and expected in rank["reason"], rank["reason"]


def test_a_time_budget_spent_before_the_first_trial_says_so(box):
    out = tune(box, "train.py", "--deepspeed_config", "ds.json", options=["--time-budget", "0.000001s"])
    refused(
        out,
        "no trial ran: the time budget of 1e-06 s was spent before the first one could start",
        "raise --time-budget",
    )
    assert "memory" not in out.err
