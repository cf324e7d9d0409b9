"""Hostile and odd input for zerotune's faces, shared by tests/test_hostile.py and bench/faults.py.

Each case builds its input in a sandbox folder and runs the CLI in this process (the tuner's
launcher replaced by the fake one, so nothing trains). A case passes when the CLI ends with a
status (0, or 2 with one message), never a traceback, and nothing outside the results folder
changed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import FakeLauncher  # noqa: E402

SCRIPT = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank')\n"
CONFIG = {
    "zero_optimization": {"stage": [0, 1]},
    "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.99]}},
    "autotuning": {"max_train_batch_size": 8, "max_train_micro_batch_size_per_gpu": 4},
}


@dataclass
class Outcome:
    code: int | None
    out: str
    err: str
    traceback: str
    escaped: list[str]


def snapshot(box: Path, results: Path) -> dict[str, float]:
    """Every file under ``box`` outside ``results``, with its modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(box):
        here = Path(dirpath)
        if here == results or results in here.parents:
            dirnames[:] = []
            continue
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            p = here / name
            try:
                out[str(p)] = p.lstat().st_mtime_ns
            except OSError:
                pass
    return out


def run_cli(argv: list[str], box: Path, results: Path) -> Outcome:
    """``zerotune argv`` in this process with cwd ``box`` and the fake launcher."""
    from zerotune import cli
    from zerotune.launch import _cluster as cluster

    before = snapshot(box, results)
    out, err = io.StringIO(), io.StringIO()
    tb, code = "", None
    cwd = os.getcwd()
    original = cluster.Cluster.make_launcher
    cluster.Cluster.make_launcher = lambda self: FakeLauncher()
    try:
        os.chdir(box)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
    except SystemExit as e:  # argparse's own usage errors exit 2
        code = e.code if isinstance(e.code, int) else 2
    except BaseException:
        tb = traceback.format_exc()
    finally:
        os.chdir(cwd)
        cluster.Cluster.make_launcher = original
    after = snapshot(box, results)
    escaped = sorted(p for p in after if before.get(p) != after[p])
    return Outcome(code, out.getvalue(), err.getvalue(), tb, escaped)


def tuned_folder(box: Path) -> Path:
    """A real (fake-launcher) tuning's results folder in ``box``."""
    (box / "train.py").write_text(SCRIPT)
    (box / "ds.json").write_text(json.dumps(CONFIG))
    results = box / "results"
    outcome = run_cli(
        [
            "tune",
            "--quiet",
            "--num-gpus",
            "2",
            "--results-dir",
            str(results),
            "train.py",
            "--deepspeed_config",
            "ds.json",
        ],
        box,
        results,
    )
    assert outcome.code == 0, outcome.err + outcome.traceback
    return results


def damages(results: Path) -> list[tuple[str, callable]]:
    """Ways a results folder gets damaged: (name, function that damages ``results``)."""
    trial = next(p for p in sorted(results.iterdir()) if (p / "result.json").exists())

    def put(path: Path, text: str | bytes):
        def go():
            if isinstance(text, bytes):
                path.write_bytes(text)
            else:
                path.write_text(text)

        return go

    session = results / "tuning.json"
    data = json.loads(session.read_text())
    result = json.loads((trial / "result.json").read_text())

    measurement = result["result"]["measurement"] or {}

    def remeasured(**changes):
        run = {**result["result"], "measurement": {**measurement, **changes}}
        return put(session, json.dumps({**data, "remeasured": [run], "confirm_from_trial": data.get("best")}))

    def with_result(**changes):
        broken = json.loads(json.dumps(result))
        broken["result"].update(changes)
        return put(trial / "result.json", json.dumps(broken))

    return [
        ("empty tuning.json", put(session, "")),
        ("truncated tuning.json", put(session, session.read_text()[:40])),
        ("list tuning.json", put(session, "[1, 2]")),
        ("trials not a list", put(session, json.dumps({**data, "trials": "z0"}))),
        ("unknown metric", put(session, json.dumps({**data, "metric": "speed"}))),
        ("trial name with a path", put(session, json.dumps({**data, "trials": ["../../etc", "/abs"]}))),
        ("non-UTF-8 tuning.json", put(session, b"\xff\xfe{")),
        ("truncated result.json", put(trial / "result.json", (trial / "result.json").read_text()[:30])),
        ("list result.json", put(trial / "result.json", "[]")),
        ("null result", put(trial / "result.json", json.dumps({**result, "result": None}))),
        ("zero step time", with_result(measurement={**(result["result"]["measurement"] or {}), "step_time_mean": 0})),
        (
            "absurd interval",
            with_result(measurement={**(result["result"]["measurement"] or {}), "step_time_ci95": 1e300}),
        ),
        ("string stage", with_result(spec={**result["result"]["spec"], "stage": "2"})),
        ("unknown state", with_result(state="great")),
        ("corrupt best ds_config", put(results / (data.get("best") or trial.name) / "ds_config.json", "{oops")),
        ("best_config a list", put(session, json.dumps({**data, "best_config": [1]}))),
        ("report is a link out", lambda: (results / "report").symlink_to(results.parent / "elsewhere")),
        (
            "report png is a link out",
            lambda: (
                (results / "report").mkdir(exist_ok=True),
                (results / "report" / "memory.png").symlink_to(results.parent / "png_target"),
            ),
        ),
        ("control characters in a reason", with_result(reason="\x1b[31mred\x1b]0;title\x07\x00", state="crashed")),
        ("steps not a count", with_result(measurement={**measurement, "steps_measured": "x"})),
        ("FLOPs not a number", with_result(measurement={**measurement, "flops_per_step": "x"})),
        ("absurd step spread", with_result(measurement={**measurement, "step_time_std": 1e308})),
        ("left-out steps not times", with_result(measurement={**measurement, "left_out": ["x", -1]})),
        (
            "left-out median not a time",
            with_result(measurement={**measurement, "left_out": [2.0], "left_out_median": "slow"}),
        ),
        # A confirmation's re-measurements (tuning.json), combined for the best line on show.
        ("re-measurement without a step count", remeasured(steps_measured=None)),
        ("absurd re-measurement", remeasured(step_time_std=1e308, step_time_mean=1e308)),
    ]
