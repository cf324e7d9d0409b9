"""A tuning inside a real Slurm allocation (two slurmd "nodes" on this machine, see
tests/slurm_cluster.py): its trials are job steps of the allocation, two at once, one per node;
then the batch script it writes trains with the choice. Real DeepSpeed on CPU."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from procs import trial_processes
from slurm_cluster import NODES, SlurmCluster, missing

pytestmark = pytest.mark.integration
GPT = ROOT / "examples" / "gpt.py"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if why := missing():
        pytest.skip(f"no Slurm cluster here: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_trials_run_as_job_steps_of_the_allocation_and_the_batch_script_trains(slurm, tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(
        json.dumps(
            {
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": [0, 1]},
                "train_micro_batch_size_per_gpu": [8],
                "autotuning": {"start_profile_step": 2, "end_profile_step": 5},
            }
        )
    )
    res = tmp_path / "results"
    env = {**slurm.env, "DS_ACCELERATOR": "cpu", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        ["salloc", f"--nodes={len(NODES)}", "--job-name=zerotune-test",
         sys.executable, "-m", "zerotune.cli", "tune", "--num-nodes", "1", "--num-gpus", "1",
         "--log-format", "json", "--results-dir", str(res), "--precision", "0.2",
         str(GPT), "--model", "tiny", "--steps", "60", "--deepspeed_config", str(cfg)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events if e["event"] in ("started", "finished")]
    assert kinds[:2] == ["started", "started"]  # one trial on each node at once
    steps = [(res / t / "step.txt").read_text().split() for t in ("z0_mb8_gas1", "z1_mb8_gas1")]
    assert {s[2] for s in steps} == set(NODES)  # "<job>.<step> on <node>": one per node
    assert len({s[0].split(".")[0] for s in steps}) == 1 and all("." in s[0] for s in steps)
    assert "srun --jobid=" in (res / "z0_mb8_gas1" / "cmd.txt").read_text()
    assert slurm.steps() == [] and trial_processes(res) == []  # no step or process outlives the tuning
    batch = res / "sbatch_optimal.sh"
    assert "#SBATCH --nodes=1" in batch.read_text()
    trained = subprocess.run(
        ["sbatch", "--wait", f"--output={tmp_path / 'train.out'}", str(batch)],
        capture_output=True, text=True, env={**slurm.env, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=600,
    )  # fmt: skip
    log = (tmp_path / "train.out").read_text() if (tmp_path / "train.out").exists() else ""
    assert trained.returncode == 0, trained.stderr[-2000:] + log[-3000:]
    assert "step 60 loss" in log
