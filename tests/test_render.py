"""The summary a user reads: 80 columns without wrapped figures, and the environment the
figures hold in named beside the choice."""

import io

from rich.console import Console

from fakes import FakeLauncher
from zerotune import Autotuner, load_results
from zerotune.cli._render import print_summary
from zerotune.launch._hardware import Node

GIB = 1024**3


def cpu_tuning(tmp_path, script, make_config, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tuner = Autotuner(
        [str(script), "--deepspeed_config", str(make_config())],
        num_gpus=2,
        memory_per_device="6GiB",
        launcher=FakeLauncher(),
        node=Node("cpu", 0, 0, 64 * GIB),
        results_dir=tmp_path / "r",
    )
    return tuner.tune()


def test_the_summary_fits_80_columns_and_names_the_environment(tmp_path, script, make_config, monkeypatch):
    result = cpu_tuning(tmp_path, script, make_config, monkeypatch)
    out = io.StringIO()
    print_summary(result, Console(file=out, width=80, highlight=False, color_system=None))
    lines = out.getvalue().splitlines()
    # Every line within 80 columns but the command to copy, which is never broken.
    hint = next(line for line in lines if line.startswith("figures: "))
    assert hint == f"figures: zerotune report {tmp_path / 'r'}"
    assert all(len(line) <= 80 for line in lines if line is not hint)
    rows = [line for line in lines if line.strip()[:1].isdigit()]
    assert len(rows) == 4  # one line per stage: no figure wrapped onto a second line
    measured = [row for row in rows if row.split()[2] != "0"]
    assert len(measured) == 3  # stage 3 is not run: stage 2 fits every micro-batch
    for row in measured:
        assert "±" in row and row.split()[-1].startswith("z")
    env = next(line for line in lines if line.startswith("environment:"))
    assert "OMP_NUM_THREADS=" in env and "DS_ACCELERATOR=cpu" in env
    assert lines.index(env) == next(i for i, line in enumerate(lines) if line.startswith("best:")) + 1

    text = (tmp_path / "r" / "summary.txt").read_text().splitlines()
    stage_table = text[: text.index("")]
    assert all(len(line) <= 80 for line in stage_table)
    assert "environment: DS_ACCELERATOR=cpu OMP_NUM_THREADS=" in "\n".join(text)
    trial_head = next(line for line in text if line.startswith("trial "))
    assert trial_head.index("why not chosen") <= 80  # the figures come first, within 80 columns
    # `zerotune show` reads the same from disk.
    assert load_results(tmp_path / "r").env == result.env


def test_cpu_trials_fix_the_allocator_where_the_user_did_not(monkeypatch):
    import sys

    from zerotune.launch import CPU_MALLOC, trial_env

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")  # the user's own: kept
    env = trial_env(2, "cpu")
    if sys.platform.startswith("linux"):
        assert env["MALLOC_MMAP_THRESHOLD_"] == CPU_MALLOC["MALLOC_MMAP_THRESHOLD_"] == str(32 * 1024**2)
    assert env["MALLOC_TRIM_THRESHOLD_"] == "0"
    assert "MALLOC_MMAP_THRESHOLD_" not in trial_env(2, "cuda")  # the GPU's allocator is torch's own


def test_no_environment_line_on_gpu(tuner_factory):
    result = tuner_factory(memory="6GiB").tune()
    assert result.env == {} and result.env_line() is None


def test_a_step_left_out_as_a_disturbance_is_named_in_the_summary(tuner_factory):
    import json

    from fakes import FakeMachine
    from zerotune.tuning._outputs import summary_text

    name = "z1_mb8_gas4"
    tuner = tuner_factory(
        machine=FakeMachine(left_out={name: [2.73]}),
        config={"zero_optimization": {"stage": [1]}, "train_micro_batch_size_per_gpu": [8]},
    )
    result = tuner.tune()
    for res in (result, load_results(tuner.results_dir)):
        lines = [x for x in summary_text(res).splitlines() if x.startswith("left out: ")]
        assert len(lines) == 1 and lines[0].startswith(f"left out: {name}: 1 step (2.73 s; their median ")
        assert "its figure is of the other steps" in lines[0]
    stored = json.loads((tuner.results_dir / "results.json").read_text())
    assert next(t for t in stored["trials"] if t["name"] == name)["measurement"]["left_out"] == [2.73]
    from zerotune.report._html import write_report

    page = write_report(tuner.results_dir).read_text()
    assert f"<li>left out: {name}: 1 step (2.73 s; their median " in page
