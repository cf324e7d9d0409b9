"""Two "nodes" on this machine: torchrun agents with a rendezvous on loopback (no ssh), and two
concurrent trials pinned to disjoint cores. Real DeepSpeed on CPU."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from procs import trial_processes

pytestmark = pytest.mark.integration
ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}
GPT = ROOT / "examples" / "gpt.py"


def ds_config(tmp_path, stages, micro_batches):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": stages},
                "train_micro_batch_size_per_gpu": micro_batches,
                "autotuning": {"max_train_batch_size": 16, "start_profile_step": 2, "end_profile_step": 5},
            }
        )
    )
    return path


def tune_one_node_trials(tmp_path, hostfile, res, env):
    """``zerotune tune`` of the GPT example with one-node trials over ``hostfile`` (torchrun agents)."""
    return subprocess.run(
        [sys.executable, "-m", "zerotune.cli", "tune", "--hostfile", str(hostfile), "--num-nodes", "1",
         "--launcher", "torchrun", "--log-format", "json", "--results-dir", str(res), "--precision", "0.2",
         str(GPT), "--model", "tiny", "--deepspeed_config", str(ds_config(tmp_path, [0, 1], [8]))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )  # fmt: skip


def test_two_nodes_through_torchrun_agents(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    res = tmp_path / "results"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerotune.cli",
            "tune",
            "--hostfile",
            str(hostfile),
            "--launcher",
            "torchrun",
            "--results-dir",
            str(res),
            "--precision",
            "0.2",
            str(GPT),
            "--model",
            "tiny",
            "--deepspeed_config",
            str(ds_config(tmp_path, [1], [8])),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads((res / "results.json").read_text())
    ok = [t for t in results["trials"] if t["state"] == "ok"]
    assert ok
    trial = res / ok[0]["name"]
    assert {p.name for p in trial.glob("rank*.json")} == {"rank0.json", "rank1.json"}  # one rank per node
    assert (trial / "launcher.node0.log").exists() and (trial / "launcher.node1.log").exists()
    assert "--node-rank=1" in (trial / "cmd.txt").read_text()
    assert trial_processes(res.resolve()) == []


def test_two_trials_at_once_on_disjoint_cores(tmp_path):
    res = tmp_path / "results"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerotune.cli",
            "tune",
            "--num-gpus",
            "1",
            "--log-format",
            "json",
            "--max-concurrent-trials",
            "2",
            "--results-dir",
            str(res),
            "--precision",
            "0.2",
            str(GPT),
            "--model",
            "tiny",
            "--deepspeed_config",
            str(ds_config(tmp_path, [0, 1], [8])),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines()]  # stdout holds JSON lines only
    assert events[-1]["event"] == "result" and events[-1]["best"]
    assert [e["event"] for e in events].count("started") == 2
    kinds = [e["event"] for e in events if e["event"] in ("started", "finished")]
    assert kinds[:2] == ["started", "started"]  # the second started before the first finished


def test_two_trials_at_once_on_two_nodes_of_one_process_each(tmp_path):
    # Two "nodes" (names of this machine), trials of one node each: the hostfile holds two
    # trial topologies, and the tuning runs a trial on each at once.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    res = tmp_path / "results"
    out = tune_one_node_trials(tmp_path, hostfile, res, ENV)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines()]
    kinds = [e["event"] for e in events if e["event"] in ("started", "finished")]
    assert kinds[:2] == ["started", "started"]  # the second started before the first finished
    logs = sorted(res.glob("z*/cmd.txt"))
    assert len(logs) == 2 and {"--master-addr=127.0.0.1"} <= set(logs[0].read_text().split())
    assert trial_processes(res) == []


def test_a_node_that_fails_during_the_tuning_leaves_the_pool_and_the_tuning_finishes_on_the_other(tmp_path):
    # node-b answers ssh before the first trial (the reachability and shared-storage checks run
    # there, on this machine), then refuses the connection that would start its trial's ranks.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(
        '#!/bin/sh\nfor last; do :; done\ncase "$last" in\n  true|printf*) exec sh -c "$last" ;;\nesac\n'
        'echo "ssh: connect to host node-b port 22: Connection refused" >&2\nexit 255\n'
    )
    ssh.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\nnode-b slots=1\n")
    res = tmp_path / "results"
    out = tune_one_node_trials(tmp_path, hostfile, res, {**ENV, "PATH": f"{bin_dir}{os.pathsep}{ENV['PATH']}"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["event"] for e in events].count("started") == 3  # the trial on node-b ran again here
    summary = (res / "summary.txt").read_text()
    assert "hosts left out of the pool: node-b: ssh: connect to host node-b port 22: Connection refused" in summary
    result = json.loads((res / "results.json").read_text())
    assert sorted(t["state"] for t in result["trials"]) == ["ok", "ok"]
    assert "node-b" not in (res / "cmd_optimal.txt").read_text() and trial_processes(res) == []
