"""Trials as Slurm job steps, with fake Slurm tools (srun, scontrol, squeue, scancel) on PATH;
tests/integration/test_slurm_cluster.py runs them on a real Slurm."""

import os
import stat
import sys

import pytest

from zerotune import ZerotuneError
from zerotune.launch import (
    RANKS_ENV,
    Allocation,
    Cluster,
    ClusterSettings,
    Host,
    Slot,
    SlurmLauncher,
    TrialJob,
    check_shared,
)
from zerotune.trials import TrialSpec

SCONTROL = """#!/bin/sh
if [ "$1 $2" = "show hostnames" ]; then
  case "$3" in
    "gpu[01-04]") printf 'gpu01\\ngpu02\\ngpu03\\ngpu04\\n' ;;
    *) echo "scontrol: error: bad node list" >&2; exit 1 ;;
  esac
elif [ "$1 $2" = "show node" ]; then
  echo "NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.${4#gpu} NodeHostName=$4"
fi
"""


def tools(tmp_path, monkeypatch, **scripts):
    """Fake Slurm tools on PATH: each logs its arguments to ``<name>.log``; ``scripts`` overrides."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    defaults = {"scontrol": SCONTROL, "srun": "#!/bin/sh\nexit 0\n", "squeue": "#!/bin/sh\n", "scancel": "#!/bin/sh\n"}
    for name, text in {**defaults, **scripts}.items():
        body = text.replace("#!/bin/sh\n", f'#!/bin/sh\necho "$@" >> {bin_dir / (name + ".log")}\n', 1)
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    return bin_dir


def job(tmp_path, num_gpus):
    d = tmp_path / "trial"
    d.mkdir(exist_ok=True)
    return TrialJob(
        spec=TrialSpec(stage=1, micro_batch=2),
        trial_dir=d,
        script="train.py",
        script_args=[],
        local_rank_arg=True,
        num_gpus=num_gpus,
        budget=None,
        warmup_steps=1,
        min_steps=3,
    )


@pytest.fixture
def allocation(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-04]")
    return tools(tmp_path, monkeypatch)


def test_the_allocation_is_read_from_slurm_and_its_node_list_expanded(allocation, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "gpu:8")
    found = Allocation.detect()
    assert found == Allocation(
        job_id="77", nodes=("gpu01", "gpu02", "gpu03", "gpu04"), tasks_per_node=8, gpus_per_node=8
    )
    assert Allocation.detect({}) is None


def test_an_unreadable_node_list_is_one_error(allocation, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "nonsense[")
    with pytest.raises(ZerotuneError, match="cannot expand the allocation's node list 'nonsense\\['.*bad node list"):
        Allocation.detect()


def test_the_allocation_splits_into_slots_of_the_trial_topology(allocation):
    cluster = Cluster.build(ClusterSettings(num_nodes=2), device="cuda", device_count=8, num_gpus=8)
    assert cluster.slurm_job == "77" and (cluster.num_nodes, cluster.num_gpus, cluster.world) == (2, 8, 16)
    slots = cluster.slots(None)
    assert [[h.name for h in s.hosts] for s in slots] == [["gpu01", "gpu02"], ["gpu03", "gpu04"]]
    assert cluster.slots(1)[0].hosts == slots[0].hosts
    assert cluster.topology() == {"device": "cuda", "num_gpus": 8, "num_nodes": 2, "hosts": None, "slurm": True}
    assert isinstance(cluster.make_launcher(), SlurmLauncher)
    every = Cluster.build(ClusterSettings(), device="cuda", device_count=8, num_gpus=None)
    assert (every.num_nodes, every.num_gpus, len(every.slots(None))) == (4, 8, 1)


def test_no_slurm_and_a_hostfile_keep_this_node_and_the_hostfile(allocation, tmp_path):
    assert Cluster.build(ClusterSettings(slurm=False), device="cpu", device_count=0, num_gpus=2).hosts is None
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    assert Cluster.build(ClusterSettings(hostfile=hostfile), device="cpu", device_count=0, num_gpus=2).slurm_job is None
    with pytest.raises(ZerotuneError, match="--slurm takes the nodes from the allocation"):
        Cluster.build(ClusterSettings(hostfile=hostfile, slurm=True), device="cpu", device_count=0, num_gpus=2)
    with pytest.raises(ZerotuneError, match="under Slurm the nodes are the allocation's"):
        Cluster.build(ClusterSettings(include="gpu01"), device="cpu", device_count=0, num_gpus=2)
    with pytest.raises(ZerotuneError, match="--num-nodes 5 is more than the 4 host"):
        Cluster.build(ClusterSettings(num_nodes=5), device="cpu", device_count=0, num_gpus=2)


def test_slurm_asked_for_outside_an_allocation_is_one_error(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ZerotuneError, match="SLURM_JOB_ID is not set; run zerotune inside salloc or sbatch"):
        Cluster.build(ClusterSettings(slurm=True), device="cpu", device_count=0, num_gpus=1)


def test_a_trial_is_one_job_step_over_its_slot_nodes(allocation, tmp_path):
    launcher = SlurmLauncher("77", [Host("gpu01", (0, 1))], device="cuda")
    trial = job(tmp_path, num_gpus=2)
    trial.slot = Slot(1, (0, 1), hosts=(Host("gpu03", (0, 1)), Host("gpu04", (0, 1))))
    d, env = launcher.prepare(trial)
    (group,) = launcher.start(trial, d, env, 29555)
    group.proc.wait()
    srun = (allocation / "srun.log").read_text().split()
    assert srun[:9] == [
        "--jobid=77",
        "--nodes=2",
        "--nodelist=gpu03,gpu04",
        "--ntasks-per-node=2",
        "--ntasks=4",
        "--exclusive",
        "--kill-on-bad-exit=1",
        f"--job-name=zerotune-{os.getpid()}-29555",
        "--export=ALL",
    ]
    assert srun[9:] == [sys.executable, "-u", "-m", "zerotune.probe"]
    assert launcher.world(trial) == 4 and launcher.buffer_address(trial) == "10.0.0.03"
    assert "srun --jobid=77" in (d / "cmd.txt").read_text()


def test_the_step_environment_gives_ranks_their_rendezvous(allocation, tmp_path, monkeypatch):
    out = tmp_path / "env.txt"
    tools(tmp_path, monkeypatch, srun=f"#!/bin/sh\nenv > {out}\n")
    launcher = SlurmLauncher("77", [Host("gpu02", (0,)), Host("gpu03", (0,))], device="cpu")
    trial = job(tmp_path, num_gpus=1)
    d, env = launcher.prepare(trial)
    launcher.start(trial, d, env, 29556)[0].proc.wait()
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert seen[RANKS_ENV] == "slurm" and seen["MASTER_ADDR"] == "10.0.0.02" and seen["MASTER_PORT"] == "29556"
    assert (seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == ("2", "1")


def test_ending_a_trial_or_the_tuner_cancels_its_steps_never_the_allocation(allocation, tmp_path, monkeypatch):
    me = os.getpid()
    listing = f"77 zerotune-{me}-29555\n77.0 zerotune-{me}-29555\n77.1 zerotune-{me}-29600\n77.2 someone-else\n78.0 zerotune-{me}-29555\n"
    tools(tmp_path, monkeypatch, squeue=f"#!/bin/sh\nprintf '{listing}'\n")
    launcher = SlurmLauncher("77", [Host("gpu01", (0,))], device="cpu")
    launcher._steps[29555] = (f"zerotune-{me}-29555", "127.0.0.1")
    launcher.release(29555)
    assert (allocation / "scancel.log").read_text().split() == ["77.0"]
    (allocation / "scancel.log").unlink()
    launcher.close()
    assert (allocation / "scancel.log").read_text().split() == ["77.0", "77.1"]
    assert "--jobs=77" in (allocation / "squeue.log").read_text()


def test_missing_slurm_tools_are_one_error_before_any_trial(allocation, monkeypatch, tmp_path):
    (allocation / "scancel").unlink()
    monkeypatch.setenv("PATH", str(allocation))  # the real tools, where installed, out of sight
    with pytest.raises(ZerotuneError, match="needs 'scancel'"):
        SlurmLauncher("77", [Host("gpu01", (0,))], device="cpu").preflight()


def test_every_node_writes_a_marker_the_tuner_reads_before_any_trial(tmp_path):
    writer = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"

    def marker(host, path, token):
        if host.name == "elsewhere":  # writes, but into a folder this node does not see
            path = tmp_path / "other" / path.name
            path.parent.mkdir(exist_ok=True)
        if host.name == "broken":
            return [sys.executable, "-c", "import sys; sys.exit('node broken: down')"]
        return [sys.executable, "-c", writer, str(path), token]

    results = tmp_path / "results"
    results.mkdir()
    pool = [Host(n, (0,)) for n in ("a", "elsewhere", "broken")]
    failed = check_shared(results, pool, [pool[0]], marker)
    assert set(failed) == {"elsewhere", "broken"}
    assert "not on storage both see" in failed["elsewhere"] and "node broken: down" in failed["broken"]
    assert not list(results.iterdir())  # the markers are gone
    with pytest.raises(ZerotuneError, match="host 'elsewhere', which the training runs on.*--results-dir"):
        check_shared(results, pool, [pool[1]], marker)


def test_the_tuner_under_slurm_writes_a_batch_script_of_the_tuned_topology(allocation, tuner_factory, tmp_path):
    tuner = tuner_factory(num_nodes=2)
    assert len(tuner.slots) == 2 and tuner.world == 4
    result = tuner.tune()
    assert result.best is not None
    batch = (tmp_path / "results" / "sbatch_optimal.sh").read_text()
    command = (tmp_path / "results" / "cmd_optimal.txt").read_text()
    assert batch.startswith("#!/bin/bash\n#SBATCH --job-name=zerotune-optimal\n#SBATCH --nodes=2\n")
    assert "#SBATCH --gpus-per-node=2" in batch and "--nproc-per-node=2" in command
    assert command.splitlines()[-1] in batch.splitlines() and "srun --nodes=2" in command
    assert os.access(tmp_path / "results" / "sbatch_optimal.sh", os.X_OK)


def test_a_probe_rank_of_a_job_step_takes_slurm_task_ids(tmp_path, monkeypatch):
    from zerotune.probe.__main__ import _ranks_from_slurm

    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu02")
    monkeypatch.delenv("RANK", raising=False)
    _ranks_from_slurm({"out_dir": str(tmp_path)})
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("0", "0")
    assert (tmp_path / "step.txt").read_text() == "77.3 on gpu02\n"
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    _ranks_from_slurm({"out_dir": str(tmp_path / "none")})  # only rank 0 names the step
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("5", "1")


def test_a_node_that_srun_reports_failing_before_its_ranks_started_leaves_the_pool(allocation, tmp_path):
    launcher = SlurmLauncher("77", [Host("gpu01", (0,))], device="cpu")
    trial = job(tmp_path, num_gpus=1)
    trial.slot = Slot(1, (0,), hosts=(Host("gpu03", (0,)), Host("gpu04", (0,))))
    d = trial.trial_dir
    (d / "rank0.started").write_text("gpu03")
    (d / "launcher.log").write_text(
        "srun: error: Task launch for StepId=77.3 failed on node gpu04: Communication connection failure\n"
        "srun: error: gpu03: task 0: Killed\n"
    )
    assert launcher.failed_hosts(trial, d, [], [True]) == {
        "gpu04": "srun: error: Task launch for StepId=77.3 failed on node gpu04: Communication connection failure"
    }
    (d / "launcher.log").write_text("srun: error: gpu03: task 0: Exited with exit code 1\n")
    assert launcher.failed_hosts(trial, d, [], [True]) == {}  # its rank started: the config's failure
