"""DeepSpeed's question about the CPU, asked once per host and tuning (zerotune._cpu_info)."""

from __future__ import annotations

import importlib
import json
import socket
import sys
import types

import pytest

from zerotune import _cpu_info as cpu_info

INFO = {"arch": "X86_64", "flags": ["sse2", "avx2"], "brand_raw": "Test CPU"}


@pytest.fixture
def fake_cpuinfo(monkeypatch):
    """A py-cpuinfo whose question counts how often it is asked."""
    module = types.ModuleType("cpuinfo")
    module.asked = 0

    def get_cpu_info():
        module.asked += 1
        return json.loads(json.dumps(INFO))

    module.get_cpu_info = get_cpu_info
    monkeypatch.setitem(sys.modules, "cpuinfo", module)
    return module


def stored(path, host=None, info=None):
    path.write_text(json.dumps({"host": host or socket.gethostname(), "info": info or INFO}))


def test_a_rank_without_the_answer_asks_once_and_keeps_it(fake_cpuinfo, tmp_path):
    cpu_info.install(tmp_path / "missing.json")
    first = fake_cpuinfo.get_cpu_info()
    first["flags"].append("changed by a caller")
    assert [fake_cpuinfo.get_cpu_info() for _ in range(3)] == [INFO] * 3
    assert fake_cpuinfo.asked == 1
    cpu_info.install(tmp_path / "missing.json")  # installed twice: still one question
    fake_cpuinfo.get_cpu_info()
    assert fake_cpuinfo.asked == 1


def test_a_rank_reads_the_answer_of_its_host(fake_cpuinfo, tmp_path):
    path = tmp_path / cpu_info.FILE
    stored(path, info={**INFO, "brand_raw": "from the file"})
    cpu_info.install(str(path))
    assert fake_cpuinfo.get_cpu_info()["brand_raw"] == "from the file"
    assert fake_cpuinfo.asked == 0


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"host": "elsewhere", "info": INFO}),
        json.dumps({"host": socket.gethostname(), "info": "flags"}),
    ],
)
def test_another_hosts_or_a_damaged_answer_is_not_used(fake_cpuinfo, tmp_path, text):
    path = tmp_path / cpu_info.FILE
    path.write_text(text)
    cpu_info.install(path)
    assert fake_cpuinfo.get_cpu_info() == INFO
    assert fake_cpuinfo.asked == 1


@pytest.fixture
def importable_cpuinfo(monkeypatch, tmp_path):
    """A py-cpuinfo package on the path, not imported yet; the import system as it was after."""
    package = tmp_path / "site" / "cpuinfo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from cpuinfo.cpuinfo import *\n")
    (package / "cpuinfo.py").write_text(f"asked = []\ndef get_cpu_info():\n    asked.append(1)\n    return {INFO!r}\n")
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delitem(sys.modules, "cpuinfo", raising=False)
    monkeypatch.delitem(sys.modules, "cpuinfo.cpuinfo", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    yield
    for name in ("cpuinfo", "cpuinfo.cpuinfo"):
        sys.modules.pop(name, None)


def test_py_cpuinfo_is_patched_when_imported_not_before(importable_cpuinfo, tmp_path):
    """Imported early, py-cpuinfo's multiprocessing changes how the interpreter's exit finalizes
    a failed script's files (test_run_mode): the probe installs the cache without importing it."""
    path = tmp_path / cpu_info.FILE
    stored(path, info={**INFO, "brand_raw": "from the file"})
    cpu_info.install(path)
    cpu_info.install(path)
    assert "cpuinfo" not in sys.modules
    from cpuinfo import get_cpu_info  # as DeepSpeed does, where it asks

    assert get_cpu_info()["brand_raw"] == "from the file"
    assert sys.modules["cpuinfo.cpuinfo"].asked == []
    assert sys.modules["cpuinfo"].__spec__.loader.is_package("cpuinfo")  # the loader's other questions


def test_without_py_cpuinfo_nothing_breaks(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setitem(sys.modules, "cpuinfo", None)  # as if not installed
    cpu_info.install(tmp_path / cpu_info.FILE)
    with pytest.raises(ImportError):
        importlib.import_module("cpuinfo")


def test_prefetch_replaces_the_last_tunings_answer(tmp_path):
    path = tmp_path / cpu_info.FILE
    stored(path, info={"arch": "ARM_8", "flags": []})
    seen = []

    def ask():
        seen.append(path.exists())  # asked after the old answer is gone
        return INFO

    cpu_info.prefetch(path, ask).join()
    assert seen == [False]
    assert cpu_info.read(path) == INFO
    assert json.loads(path.read_text())["host"] == socket.gethostname()


@pytest.mark.parametrize("ask", [lambda: None, lambda: 1 / 0])
def test_a_failed_prefetch_leaves_no_answer(tmp_path, ask):
    path = tmp_path / cpu_info.FILE
    stored(path)
    cpu_info.prefetch(path, ask).join()
    assert not path.exists()


def test_a_link_in_its_place_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    results = tmp_path / "results"
    results.mkdir()
    (results / cpu_info.FILE).symlink_to(outside)
    cpu_info.prefetch(results / cpu_info.FILE, lambda: INFO).join()
    assert outside.read_text() == "keep"
    assert not (results / cpu_info.FILE).is_symlink() and cpu_info.read(results / cpu_info.FILE) == INFO


def test_deepspeed_reads_the_stored_answer(fake_cpuinfo, tmp_path):
    """DeepSpeed imports get_cpu_info where it calls it, so the installed one is what it gets:
    the SIMD flags it compiles its CPU ops with follow the stored answer."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    path = tmp_path / cpu_info.FILE
    stored(path, info={"arch": "X86_64", "flags": ["avx512f"]})
    cpu_info.install(path)
    builder = types.SimpleNamespace(name="test", warning=print, _backup_cpuinfo=lambda: None)
    assert OpBuilder.simd_width(builder) == "-D__AVX512__"
    assert OpBuilder.cpu_arch(builder) == "-march=native"
    assert fake_cpuinfo.asked == 0


def test_the_launcher_asks_once_per_results_folder_and_tells_the_ranks_where(tmp_path, monkeypatch):
    from zerotune.launch import TrialJob
    from zerotune.launch._local import LocalLauncher
    from zerotune.trials._settings import MeasureSettings
    from zerotune.trials._trial import TrialSpec

    asked = []
    monkeypatch.setattr(cpu_info, "_ask", lambda: asked.append(1) or INFO)
    launcher = LocalLauncher(device="cpu")
    envs = []
    for results, name in (
        (tmp_path / "a", "z0_mb2_gas1"),
        (tmp_path / "a", "z1_mb2_gas1"),
        (tmp_path / "b", "z0_mb2_gas1"),
    ):
        (results / name).mkdir(parents=True)
        job = TrialJob(
            spec=TrialSpec(stage=0, micro_batch=2),
            trial_dir=results / name,
            script="train.py",
            script_args=[],
            local_rank_arg=False,
            num_gpus=2,
            budget=None,
            warmup_steps=1,
            min_steps=3,
            measure=MeasureSettings(trial_timeout=60, stall_timeout=30),
            work_dir=results,
        )
        envs.append(launcher.prepare(job)[1][cpu_info.ENV])
    launcher.close()
    assert envs == [str((tmp_path / d / cpu_info.FILE).resolve()) for d in "aab"]
    assert len(asked) == 2 and cpu_info.read(envs[0]) == INFO and cpu_info.read(envs[2]) == INFO
