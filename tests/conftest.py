import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakes import FakeLauncher, FakeMachine  # noqa: E402
from probe_fakes import make_probe_factory  # noqa: E402
from zerotune.launch._hardware import Node  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3

# Every process the tests start finds this environment's tools first, as in an activated venv.
# DeepSpeed JIT-builds its CPU ops with the first `ninja` on PATH, and pip's ninja (a DeepSpeed
# dependency) and a system one hash build commands differently: tests alternating between them
# rebuilt the ops, about a minute each time, twice in every run of the suite.
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = os.pathsep.join(p for p in (_BIN, os.environ.get("PATH", "")) if p)


@pytest.fixture
def probe_factory(tmp_path, monkeypatch):
    """A probe on a fake clock (see probe_fakes.make_probe_factory); os._exit raises Exited."""
    return make_probe_factory(tmp_path, monkeypatch)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank')\n")
    return path


@pytest.fixture
def make_config(tmp_path):
    def make(autotuning=None, **top):
        cfg = {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": "all"}, **top}
        cfg["autotuning"] = {
            "max_train_batch_size": 64,
            "min_train_micro_batch_size_per_gpu": 1,
            "max_train_micro_batch_size_per_gpu": 32,
            **(autotuning or {}),
        }
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(cfg))
        return path

    return make


@pytest.fixture
def gpu_node():
    return Node("cuda", 2, 16 * GIB, 64 * GIB)


@pytest.fixture
def tuner_factory(tmp_path, script, make_config, gpu_node):
    from zerotune import Autotuner

    def make(autotuning=None, machine=None, launcher=None, memory="8GiB", **kw):
        cfg = make_config(autotuning, **kw.pop("config", {}))
        launcher = launcher or FakeLauncher(machine or FakeMachine())
        events = []
        kw.setdefault("results_dir", tmp_path / "results")
        tuner = Autotuner(
            [str(script), "--deepspeed_config", str(cfg)],
            num_gpus=2,
            memory_per_device=memory,
            launcher=launcher,
            node=kw.pop("node", gpu_node),
            on_event=events.append,
            **kw,
        )
        tuner.events = events
        return tuner

    return make
