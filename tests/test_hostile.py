"""Hostile and odd input: never a traceback, never a write outside the results folder."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile import damages, run_cli, tuned_folder


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    box = tmp_path_factory.mktemp("pristine")
    return tuned_folder(box)


def fresh(pristine, tmp_path):
    box = tmp_path / "box"
    shutil.copytree(pristine.parent, box, symlinks=True)
    return box, box / "results"


def check(outcome, *codes):
    assert not outcome.traceback, outcome.traceback
    assert not outcome.escaped, outcome.escaped
    assert outcome.code in (codes or (0, 2)), (outcome.code, outcome.err)
    if outcome.code == 2:  # one message: zerotune's, or argparse's usage line and its error
        last = outcome.err.strip().splitlines()[-1]
        assert (
            outcome.err.startswith("zerotune: error:")
            and outcome.err.count("\n") == 1
            or last.startswith("zerotune")
            and ": error: argument" in last
        ), outcome.err


DAMAGE_KINDS = 26
"""len(damages(...)): parametrize needs the count before any folder exists (checked below)."""


@pytest.mark.parametrize("index", range(DAMAGE_KINDS))
@pytest.mark.parametrize("command", ["show", "report"])
def test_damaged_results_folders(pristine, tmp_path, command, index):
    box, results = fresh(pristine, tmp_path)
    name, damage = damages(results)[index]
    damage()
    outcome = run_cli([command, str(results)], box, results)
    check(outcome)
    assert "\x1b" not in outcome.out + outcome.err and "\x00" not in outcome.out + outcome.err
    if (name.startswith(("truncated result", "left-out")) or name == "absurd interval") and command == "show":
        assert "damaged" in outcome.out  # the trial does not vanish without a word


def test_load_results_raises_only_zerotune_errors(pristine, tmp_path):
    from zerotune import ZerotuneError, load_results

    assert len(damages(fresh(pristine, tmp_path / "count")[1])) == DAMAGE_KINDS
    for index in range(DAMAGE_KINDS):
        box, results = fresh(pristine, tmp_path / str(index))
        damages(results)[index][1]()
        try:
            load_results(results)
        except ZerotuneError:
            pass


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    which=st.sampled_from(["tuning.json", "result.json", "ds_config.json"]),
    content=st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
            max_leaves=12,
        ).map(lambda v: json.dumps(v).encode()),
    ),
)
def test_random_damage_never_crashes_show_or_report(pristine, tmp_path_factory, which, content):
    box, results = fresh(pristine, tmp_path_factory.mktemp("random"))
    targets = [p for p in results.rglob(which) if not p.is_symlink()]
    targets[0].write_bytes(content)
    for command in ("show", "report"):
        check(run_cli([command, str(results)], box, results))


VALUES = st.one_of(
    st.sampled_from(
        ["nan", "inf", "-1", "0", "1e400", "1e11", "1000000000", "", "../x", "/proc/x", "2", "abc", "\x1b[31m", "1.5"]
    ),
    st.text(max_size=8),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    options=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--num-gpus",
                    "--num-nodes",
                    "--memory-per-device",
                    "--time-budget",
                    "--trial-timeout",
                    "--stall-timeout",
                    "--precision",
                    "--max-concurrent-trials",
                    "--hostfile",
                    "--include",
                    "--tensorboard",
                    "--results-dir",
                ]
            ),
            VALUES,
        ),
        max_size=3,
        unique_by=lambda o: o[0],
    )
)
def test_random_tune_arguments(pristine, tmp_path_factory, options):
    box, results = fresh(pristine, tmp_path_factory.mktemp("args"))
    argv = ["tune", "--quiet"]
    for flag, value in options:
        argv += [flag, value]
    if "--results-dir" not in dict(options):
        argv += ["--results-dir", str(results)]
    else:  # a results folder of the user's choosing: it may be anywhere under the sandbox
        results = box / dict(options)["--results-dir"] if not os.path.isabs(dict(options)["--results-dir"]) else results
    argv += ["train.py", "--deepspeed_config", "ds.json"]
    outcome = run_cli(argv, box, results)
    assert not outcome.traceback, outcome.traceback
    assert outcome.code in (0, 2), outcome.err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    options=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--params",
                    "--num-gpus",
                    "--num-nodes",
                    "--device-memory",
                    "--global-batch",
                    "--seq-len",
                    "--overhead",
                    "--activation-per-sample",
                    "--largest-layer",
                ]
            ),
            VALUES,
        ),
        max_size=3,
        unique_by=lambda o: o[0],
    )
)
def test_random_estimate_arguments(tmp_path_factory, options):
    box = tmp_path_factory.mktemp("estimate")
    argv = ["estimate"] + (["--params", "1B"] if "--params" not in dict(options) else [])
    for flag, value in options:
        argv += [flag, value]
    outcome = run_cli(argv, box, box / "none")
    check(outcome)


@pytest.mark.parametrize(
    "hf",
    [
        b"[1, 2]",
        b"\xff\xfe",
        b'{"hidden_size": Infinity, "num_hidden_layers": 2}',
        b'{"hidden_size": 1e300, "num_hidden_layers": 1e300, "vocab_size": 1e300}',
    ],
)
def test_estimate_with_a_hostile_hf_config(tmp_path, hf):
    (tmp_path / "config.json").write_bytes(hf)
    check(run_cli(["estimate", "--hf-config", str(tmp_path / "config.json")], tmp_path, tmp_path / "none"), 2)


def test_estimate_refuses_a_negative_sequence_and_a_huge_batch(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100}))
    outcome = run_cli(["estimate", "--hf-config", "config.json", "--seq-len", "-100"], tmp_path, tmp_path / "n")
    check(outcome, 2)
    assert "--seq-len" in outcome.err
    outcome = run_cli(["estimate", "--params", "7B", "--global-batch", "1000000000000"], tmp_path, tmp_path / "n")
    check(outcome, 2)


def test_estimate_factory_that_exits(tmp_path):
    (tmp_path / "m.py").write_text("import sys\ndef build():\n    sys.exit(3)\n")
    outcome = run_cli(["estimate", "--factory", "m.py:build"], tmp_path, tmp_path / "n")
    check(outcome, 2)
    assert "SystemExit" in outcome.err


def test_tensorboard_into_proc_and_a_non_utf8_results_name(pristine, tmp_path):
    box, results = fresh(pristine, tmp_path)
    check(
        run_cli(
            [
                "tune",
                "--quiet",
                "--tensorboard",
                "/proc/x",
                "--results-dir",
                str(results),
                "train.py",
                "--deepspeed_config",
                "ds.json",
            ],
            box,
            results,
        )
    )
    odd = os.fsdecode(os.fsencode(str(box)) + b"/r\xff")
    check(
        run_cli(
            ["tune", "--quiet", "--results-dir", odd, "train.py", "--deepspeed_config", "ds.json"],
            box,
            box / os.fsdecode(b"r\xff"),
        ),
        0,
    )


def test_a_read_only_results_folder_names_the_real_error(pristine, tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    box, results = fresh(pristine, tmp_path)
    real_write = Path.write_text

    def read_only(self, *a, **kw):
        if results in self.parents:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_write(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", read_only)
    outcome = run_cli(
        [
            "tune",
            "--quiet",
            "--results-dir",
            str(results),
            "--retry-failed",
            "train.py",
            "--deepspeed_config",
            "ds.json",
        ],
        box,
        results,
    )
    check(outcome, 2)
    assert "Read-only file system" in outcome.err


def test_show_on_an_ascii_only_terminal(pristine, tmp_path):
    box, results = fresh(pristine, tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "zerotune.cli", "show", str(results)],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        timeout=60,
    )
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr


def test_show_quotes_the_report_hint(pristine, tmp_path):
    box = tmp_path / "my results; rm -rf x"
    shutil.copytree(pristine.parent, box, symlinks=True)
    outcome = run_cli(["show", str(box / "results")], box, box / "results")
    check(outcome, 0)
    assert f"zerotune report '{box / 'results'}'" in outcome.out.replace("\n", "")
