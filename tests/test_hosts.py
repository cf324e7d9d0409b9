"""Multi-node placement: DeepSpeed's hostfile and filters, commands, checks before any trial."""

import os
import stat

import pytest

from zerotune import ConfigError, ZerotuneError
from zerotune.launch import TrialJob
from zerotune.launch._hosts import Host, read_hostfile, select_hosts
from zerotune.launch._multinode import MultiNodeLauncher
from zerotune.trials._trial import TrialSpec


def hostfile(tmp_path, text="# cluster\nworker-0 slots=4\nworker-1 slots=4  # spare\n\nworker-2 slots=4\n"):
    p = tmp_path / "hostfile"
    p.write_text(text)
    return p


def test_hostfile_in_deepspeeds_format(tmp_path):
    assert read_hostfile(hostfile(tmp_path)) == {"worker-0": 4, "worker-1": 4, "worker-2": 4}


@pytest.mark.parametrize(
    "text, message",
    [
        ("worker-0 4\n", "is not 'hostname slots=N'"),
        ("worker-0 slots=0\n", "with N from 1 to"),
        ("a slots=2\na slots=2\n", "listed twice"),
        ("# nothing\n", "lists no host"),
    ],
)
def test_bad_hostfiles(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        read_hostfile(hostfile(tmp_path, text))


def test_include_exclude_and_counts_as_deepspeed_reads_them(tmp_path):
    hosts = read_hostfile(hostfile(tmp_path))
    picked = select_hosts(hosts, num_nodes=None, num_gpus=None, include="worker-0:0,1@worker-2:2,3")
    assert [(h.name, h.slots) for h in picked] == [("worker-0", (0, 1)), ("worker-2", (2, 3))]
    picked = select_hosts(hosts, num_nodes=None, num_gpus=3, exclude="worker-1@worker-0:3")
    assert [(h.name, h.slots) for h in picked] == [("worker-0", (0, 1, 2)), ("worker-2", (0, 1, 2))]
    assert len(select_hosts(hosts, num_nodes=2, num_gpus=None)) == 2


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"include": "worker-9"}, "not in the hostfile"),
        ({"include": "worker-0:7"}, "has no slot 7"),
        ({"include": "worker-0", "exclude": "worker-1"}, "cannot both"),
        ({"num_nodes": 4}, "more than the 3 host"),
        ({"num_gpus": 8}, "more than host 'worker-0' offers"),
        ({"include": "worker-0:0@worker-1"}, "different numbers of slots"),
    ],
)
def test_impossible_selections(tmp_path, kw, message):
    args = {"num_nodes": None, "num_gpus": None, **kw}
    with pytest.raises(ConfigError, match=message):
        select_hosts(read_hostfile(hostfile(tmp_path)), **args)


def job(tmp_path):
    return TrialJob(
        spec=TrialSpec(stage=1, micro_batch=2),
        trial_dir=tmp_path,
        script="train.py",
        script_args=[],
        local_rank_arg=True,
        num_gpus=2,
        budget=None,
        warmup_steps=1,
        min_steps=3,
    )


def test_torchrun_agents_one_per_node_with_a_static_rendezvous(tmp_path):
    launcher = MultiNodeLauncher(
        [Host("worker-0", (0, 1)), Host("worker-1", (0, 1))], device="cuda", launcher="torchrun"
    )
    argv = launcher.torchrun_argv(job(tmp_path).num_gpus, 1, 29555)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert {
        "--nnodes=2",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=worker-0",
        "--master-port=29555",
    } <= set(argv)
    assert argv[-2:] == ["-m", "zerotune.probe"]


def test_deepspeed_runner_gets_the_chosen_slots(tmp_path):
    launcher = MultiNodeLauncher([Host("worker-0", (2, 3)), Host("worker-1", (0, 1))], device="cuda", launcher="pdsh")
    argv = launcher.runner_argv(tmp_path / "hostfile", 29555)
    assert "--include=worker-0:2,3@worker-1:0,1" in argv and "--launcher=pdsh" in argv
    assert "--master_addr=worker-0" in argv and argv[-2:] == ["--module", "zerotune.probe"]


def fake_tool(tmp_path, monkeypatch, name, exit_code, message=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit {exit_code}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")


def test_missing_tool_is_one_error_before_any_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no pdsh, no ssh here
    with pytest.raises(ZerotuneError, match="needs 'pdsh'.*--launcher torchrun"):
        MultiNodeLauncher([Host("worker-0", (0,)), Host("worker-1", (0,))], device="cpu").preflight()


def test_unreachable_host_is_one_error_before_any_trial(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "ssh", 255, "ssh: connect to host worker-1 port 22: No route to host")
    launcher = MultiNodeLauncher([Host("localhost", (0,)), Host("worker-1", (0,))], device="cpu", launcher="torchrun")
    with pytest.raises(ZerotuneError, match="cannot reach host 'worker-1' by ssh.*No route to host"):
        launcher.preflight()


def test_local_hosts_need_no_ssh(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    MultiNodeLauncher([Host("localhost", (0,)), Host("127.0.0.1", (0,))], device="cpu", launcher="torchrun").preflight()


def test_tuner_needs_a_hostfile_for_several_nodes(tuner_factory):
    with pytest.raises(ConfigError, match="--num-nodes 2 needs --hostfile"):
        tuner_factory(num_nodes=2)
    with pytest.raises(ConfigError, match="pick hosts from a --hostfile"):
        tuner_factory(include="worker-0")


def test_tuner_spans_the_hostfile(tuner_factory, tmp_path):
    tuner = tuner_factory(
        hostfile=hostfile(tmp_path), include="worker-0:0,1@worker-1:0,1", multinode_launcher="torchrun"
    )
    assert (tuner.num_nodes, tuner.num_gpus, tuner.world, tuner.trials.dp) == (2, 2, 4, 4)
    assert tuner.trials.candidates() == [1, 2, 4, 8, 16]  # the global batch of 64 over 4 data-parallel ranks


def test_trials_across_nodes_run_cold_and_say_why(tuner_factory, tmp_path):
    tuner = tuner_factory(
        hostfile=hostfile(tmp_path), include="worker-0:0,1@worker-1:0,1", multinode_launcher="torchrun"
    )
    tuner.tune()
    assert tuner.launcher.jobs and all(not j.warm and "one node" in j.cold_reason for j in tuner.launcher.jobs)


def test_a_hostfile_path_with_a_nul_is_a_clear_error():
    with pytest.raises(ConfigError, match="holds a NUL"):
        read_hostfile("hosts\x00file")


def cluster(tmp_path, text, **settings):
    from zerotune.launch import Cluster, ClusterSettings

    given = ClusterSettings(hostfile=hostfile(tmp_path, text), **settings)
    return Cluster.build(given, device="cuda", device_count=2, num_gpus=settings.get("num_gpus"))


def test_the_hostfiles_hosts_split_into_as_many_trial_topologies_as_fit(tmp_path):
    four = "".join(f"worker-{i} slots=2\n" for i in range(4))
    c = cluster(tmp_path, four, num_nodes=2)
    assert [[h.name for h in g] for g in c.groups] == [["worker-0", "worker-1"], ["worker-2", "worker-3"]]
    slots = c.slots(None)
    assert [[h.name for h in s.hosts] for s in slots] == [["worker-0", "worker-1"], ["worker-2", "worker-3"]]
    assert len(c.slots(1)) == 1 and c.num_nodes == 2 and c.world == 4  # the training's topology
    assert len(cluster(tmp_path, "".join(f"worker-{i} slots=2\n" for i in range(3)), num_nodes=2).slots(None)) == 1
    # A host with too few slots for the trial's processes per node is left out of the pool.
    short = cluster(tmp_path, "worker-0 slots=2\nworker-1 slots=1\nworker-2 slots=2\n", num_nodes=1, num_gpus=2)
    assert [[h.name for h in g] for g in short.groups] == [["worker-0"], ["worker-2"]]


def test_each_slots_trial_starts_on_its_own_hosts(tmp_path):
    from zerotune.launch import Slot

    launcher = MultiNodeLauncher(
        [Host("worker-0", (0, 1))],
        device="cuda",
        launcher="torchrun",
        pool=[Host("worker-0", (0, 1)), Host("worker-1", (0, 1))],
    )
    second = job(tmp_path)
    second.slot = Slot(1, (0, 1), hosts=(Host("worker-1", (0, 1)),))
    assert launcher.hosts_of(second) == [Host("worker-1", (0, 1))] and launcher.world(second) == 2
    assert "--master-addr=worker-1" in launcher.torchrun_argv(2, 0, 29555, launcher.hosts_of(second))
    assert launcher.buffer_address(second) == "worker-1" and launcher.buffer_address(job(tmp_path)) == "worker-0"
    runner = MultiNodeLauncher([Host("worker-0", (0, 1))], device="cuda", launcher="pdsh")
    assert "--include=worker-1:0,1" in runner.runner_argv(tmp_path / "hostfile", 29555, launcher.hosts_of(second))


def test_the_tuner_runs_a_trial_on_every_group_of_hosts_at_once(tuner_factory, tmp_path):
    from fakes import FakeMachine
    from test_concurrency import SlowFake

    launcher = SlowFake(FakeMachine(), target=2)
    tuner = tuner_factory(
        hostfile=hostfile(tmp_path, "worker-0 slots=2\nworker-1 slots=2\nworker-2 slots=2\nworker-3 slots=2\n"),
        num_nodes=2,
        multinode_launcher="torchrun",
        launcher=launcher,
    )
    assert (tuner.num_nodes, tuner.world) == (2, 4) and len(tuner.slots) == 2
    result = tuner.tune()
    assert launcher.peak == 2 and result.best is not None
    hosts = {tuple(h.name for h in j.slot.hosts) for j in launcher.jobs}
    assert hosts == {("worker-0", "worker-1"), ("worker-2", "worker-3")}
    assert "worker-0 worker-1" in (tmp_path / "results" / "cmd_optimal.txt").read_text()  # the training's hosts


def test_a_host_of_the_pool_that_cannot_be_reached_leaves_it(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "ssh", 255, "ssh: connect to host worker-1 port 22:\nNo route to host")
    pool = [Host("localhost", (0,)), Host("worker-1", (0,))]
    launcher = MultiNodeLauncher([Host("localhost", (0,))], device="cpu", launcher="torchrun", pool=pool)
    launcher.preflight()  # the training's host answers: the tuning goes on without worker-1
    assert list(launcher.dropped) == ["worker-1"] and "port 22: No route to host" in launcher.dropped["worker-1"]


def test_the_tuner_runs_no_trial_on_a_host_that_left_the_pool(tuner_factory, tmp_path):
    from fakes import FakeLauncher

    class Unreachable(FakeLauncher):
        def preflight(self):
            self.dropped = {"worker-3": "ssh cannot reach it (No route to host)"}

    launcher = Unreachable()
    tuner = tuner_factory(
        hostfile=hostfile(tmp_path, "".join(f"worker-{i} slots=2\n" for i in range(4))),
        num_nodes=2,
        multinode_launcher="torchrun",
        launcher=launcher,
    )
    assert len(tuner.slots) == 2
    result = tuner.tune()
    assert {h.name for j in launcher.jobs for h in j.slot.hosts} == {"worker-0", "worker-1"}
    assert any(n.startswith("hosts left out of the pool: worker-3: ssh cannot reach it") for n in result.notes)


class Ended:
    """A process group that ended with ``code``."""

    def __init__(self, code):
        self.proc = type("P", (), {"returncode": code})()


def test_a_remote_node_whose_processes_end_before_any_rank_started_failed(tmp_path):
    launcher = MultiNodeLauncher([Host("localhost", (0,)), Host("worker-1", (0,))], device="cpu", launcher="torchrun")
    d = tmp_path
    (d / "rank0.started").write_text("")
    (d / "launcher.node1.log").write_text("ssh: connect to host worker-1 port 22: Connection refused\n")
    trial = job(tmp_path)
    trial.num_gpus = 1
    groups = [Ended(-15), Ended(255)]
    assert launcher.failed_hosts(trial, d, groups, [False, True]) == {
        "worker-1": "ssh: connect to host worker-1 port 22: Connection refused"
    }
    assert launcher.failed_hosts(trial, d, groups, [False, False]) == {}  # ended by zerotune's kill
    (d / "rank1.started").write_text("")
    assert launcher.failed_hosts(trial, d, groups, [False, True]) == {}  # its rank ran: a result


def test_the_runner_log_names_the_node_that_failed(tmp_path):
    launcher = MultiNodeLauncher([Host("worker-0", (0,)), Host("worker-1", (0,))], device="cpu", launcher="pdsh")
    (tmp_path / "rank0.started").write_text("")
    (tmp_path / "launcher.log").write_text("pdsh@head: worker-1: ssh exited with exit code 255\n")
    trial = job(tmp_path)
    trial.num_gpus = 1
    assert launcher.failed_hosts(trial, tmp_path, [Ended(1)], [True]) == {
        "worker-1": "pdsh@head: worker-1: ssh exited with exit code 255"
    }


def test_a_host_that_fails_during_the_tuning_leaves_the_pool_and_the_command_avoids_it(tuner_factory, tmp_path):
    from fakes import FakeLauncher
    from zerotune.trials import TrialResult, TrialState

    class FailingNode(FakeLauncher):
        on: list = []

        def run(self, job):
            self.on.append(tuple(h.name for h in job.slot.hosts))
            if "worker-1" in self.on[-1]:
                self.jobs.append(job)
                self.dropped = {"worker-1": "ssh: connect to host worker-1 port 22: Connection refused"}
                return TrialResult(spec=job.spec, state=TrialState.KILLED, reason="host worker-1 failed")
            return super().run(job)

    launcher = FailingNode()
    tuner = tuner_factory(
        hostfile=hostfile(tmp_path, "".join(f"worker-{i} slots=2\n" for i in range(4))),
        num_nodes=2,
        multinode_launcher="torchrun",
        launcher=launcher,
    )
    result = tuner.tune()
    on = launcher.on
    assert on.count(("worker-0", "worker-1")) == 1 and on.count(("worker-2", "worker-3")) == len(on) - 1 > 1
    assert result.best is not None and result.best.state is TrialState.OK
    lost = launcher.jobs[0].spec
    assert [t.state for t in result.trials if t.spec == lost] == [TrialState.OK]  # measured again elsewhere
    assert any(n.startswith("hosts left out of the pool: worker-1: ssh: connect") for n in result.notes)
    assert any("cmd_optimal.txt trains on worker-2, worker-3" in n for n in result.notes)
    command = (tmp_path / "results" / "cmd_optimal.txt").read_text()
    assert "worker-2 worker-3" in command and "worker-1" not in command


def test_every_launcher_runs_trials_side_by_side_in_a_trial_pool():
    from zerotune.launch import LocalLauncher, SlurmLauncher, TrialPool

    hosts = [Host("worker-0", (0,)), Host("worker-1", (0,))]
    for launcher in (
        LocalLauncher(device="cpu"),
        MultiNodeLauncher(hosts, device="cpu", pool=hosts),
        SlurmLauncher("7", hosts, device="cpu", pool=hosts),
    ):
        pool = launcher.trial_pool(2)
        assert isinstance(pool, TrialPool)
        pool.shutdown()
