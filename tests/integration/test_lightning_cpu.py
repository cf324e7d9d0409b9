"""Lightning's DeepSpeed strategy through zerotune's subclass, on CPU with 2 processes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytestmark = pytest.mark.integration
JOB = Path(__file__).with_name("lightning_job.py")


def fit(*args):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(JOB), *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=600, cwd=JOB.parent)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trains_on_cpu_with_each_zero_stage(stage):
    ranks = fit("object", stage)
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["stage"] == stage and r["device"] == "cpu" for r in ranks)
    assert all(r["loss"] < 5.0 for r in ranks)  # the target's variance is 16: it learned


def test_registered_by_name():
    ranks = fit("deepspeed_autotune", 0)
    assert {r["strategy"] for r in ranks} == {"AutotuneDeepSpeedStrategy"}
    assert all(r["stage"] == 2 for r in ranks)  # Lightning's DeepSpeedStrategy default
