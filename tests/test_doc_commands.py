"""Every command the README and the quick start show runs as written: each `zerotune` command of
their bash blocks (placeholders such as `[your script's args]` and `...` dropped) runs in this
process in a folder holding a `train.py`, a `ds.json` and the examples, with the fake launcher
(nothing trains); the Python block runs too. The commands are read from the pages, not copied."""

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from hostile import CONFIG, SCRIPT, run_cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "quickstart.md"]
PLACEHOLDER = re.compile(r"\[[^\]]*\]|\.\.\.")


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)


def commands(page: Path) -> list[list[str]]:
    out = []
    for block in blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = PLACEHOLDER.sub("", line.split("#", 1)[0]).strip()
            if line.startswith("zerotune "):
                out.append(shlex.split(line)[1:])
    return out


@pytest.fixture
def trained(monkeypatch):
    """What the fake launcher was asked to train (``zerotune run`` and ``run_after_tuning()``
    train after the tuning): each run's probe spec."""
    from fakes import FakeLauncher

    runs = []

    def run_program(self, probe_spec, num_gpus, extra_env, program=None):
        runs.append(json.loads(Path(probe_spec).read_text()))
        return 0

    monkeypatch.setattr(FakeLauncher, "run_program", run_program)
    return runs


@pytest.fixture
def box(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ds.json").write_text(json.dumps(CONFIG))
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_shown_runs_as_written(box, page, trained):
    shown = commands(page)
    assert {argv[0] for argv in shown} >= {"tune", "run", "show", "report"}, shown
    for argv in shown:
        out = run_cli(argv, box, box / "autotuning_results")
        assert out.code == 0 and not out.traceback, (argv, out.err[-2000:], out.traceback)
        assert not out.escaped, (argv, out.escaped)
    assert trained and all(t["mode"] == "run" and "ds_config_optimal.json" in " ".join(t["args"]) for t in trained)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_python_block_runs_as_written(box, page, monkeypatch, trained):
    from fakes import FakeLauncher
    from zerotune.launch import Cluster

    (code,) = [b for b in blocks(page, "python") if "Autotuner" in b]
    monkeypatch.chdir(box)
    monkeypatch.setattr(Cluster, "make_launcher", lambda self: FakeLauncher())
    names: dict = {}
    exec(compile(code, f"{page.name}: the Python block", "exec"), names)
    assert names["result"].best is not None and (box / "autotuning_results" / "cmd_optimal.txt").exists()
    assert [t["mode"] for t in trained] == ["run"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_lightning_lines_shown_are_the_ones_an_integration_test_runs(page):
    (code,) = [b for b in blocks(page, "python") if "deepspeed_autotune" in b]
    assert "import zerotune.lightning" in code and 'strategy="deepspeed_autotune"' in code
    runner = (ROOT / "tests" / "integration" / "lightning_features.py").read_text()
    assert "from zerotune.lightning import" in runner and '"deepspeed_autotune"' in runner
