"""Concurrent trials on disjoint devices (fake launcher; slots planned as on a real node)."""

import base64
import json
import threading

import pytest

from fakes import FakeLauncher, FakeMachine
from zerotune import ConfigError
from zerotune.launch import launcher_argv, plan_slots
from zerotune.launch._hardware import Node

GIB = 1024**3


class SlowFake(FakeLauncher):
    """Records which slots ran at once. The first ``target`` trials each wait (on a condition,
    not a clock) until ``target`` trials run at once, so that a loaded machine cannot make the
    tuner look serial: a tuner that never fills its slots fails by the timeout."""

    def __init__(self, machine=None, target: int = 4):
        super().__init__(machine)
        self.lock = threading.Condition()
        self.active: list = []
        self.peak = 0
        self.started = 0
        self.target = target
        self.overlaps_ok = True
        self.same_stage_at_once = False

    def run(self, job):
        with self.lock:
            used = {d for j in self.active for d in j.slot.devices}
            self.overlaps_ok &= not (used & set(job.slot.devices))
            self.same_stage_at_once |= job.spec.stage in {j.spec.stage for j in self.active}
            self.active.append(job)
            self.started += 1
            self.peak = max(self.peak, len(self.active))
            self.lock.notify_all()
            if self.started <= self.target:
                self.lock.wait_for(lambda: self.peak >= self.target, timeout=60)
        try:
            return super().run(job)
        finally:
            with self.lock:
                self.active.remove(job)


def tuner_on(tuner_factory, gpus, **kw):
    launcher = SlowFake(
        FakeMachine(speed={0: 1.0, 1: 0.6, 2: 1.2, 3: 0.4}),
        target=min(gpus // 2, kw.get("max_concurrent_trials") or gpus),
    )
    tuner = tuner_factory(
        {"fast": False, "tuner_early_stopping": 50, "tuner_num_trials": 200},
        launcher=launcher,
        node=Node("cuda", gpus, 16 * GIB, 64 * GIB),
        **kw,
    )
    return tuner, launcher


def test_trials_fill_every_slot_on_disjoint_gpus(tuner_factory):
    tuner, launcher = tuner_on(tuner_factory, 8)
    assert [s.devices for s in tuner.slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    result = tuner.tune()
    assert launcher.peak == 4 and launcher.overlaps_ok
    assert result.best is not None and len({t.name for t in result.trials}) == len(result.trials)


def test_max_concurrent_trials_caps_the_slots(tuner_factory):
    tuner, launcher = tuner_on(tuner_factory, 8, max_concurrent_trials=2)
    tuner.tune()
    assert len(tuner.slots) == 2 and launcher.peak == 2


def test_same_best_as_one_at_a_time(tuner_factory, tmp_path):
    parallel, _ = tuner_on(tuner_factory, 8, results_dir=tmp_path / "a")
    serial, _ = tuner_on(tuner_factory, 8, results_dir=tmp_path / "b", max_concurrent_trials=1)
    assert parallel.tune().best.name == serial.tune().best.name


def test_slots_use_the_visible_gpus_by_their_machine_ids(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert [s.devices for s in plan_slots("cuda", 4, 2, None)] == [(4, 5), (6, 7)]
    world = launcher_argv(2, 29500, [6, 7])[4].split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(world)) == {"localhost": [6, 7]}


def test_cpu_runs_one_trial_on_every_core_unless_asked(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    (only,) = plan_slots("cpu", 4, 2, None)
    assert only.devices == (0, 1, 2, 3) and not only.pinned
    two = plan_slots("cpu", 4, 2, 2)
    assert [s.devices for s in two] == [(0, 1), (2, 3)] and all(s.pinned for s in two)
    with pytest.raises(ConfigError, match="at least 1"):
        plan_slots("cpu", 4, 2, 0)


def test_the_micro_batch_search_runs_stages_side_by_side(tuner_factory):
    launcher = SlowFake()
    tuner = tuner_factory(launcher=launcher, node=Node("cuda", 8, 16 * GIB, 64 * GIB))
    result = tuner.tune()
    assert launcher.peak == 4 and not launcher.same_stage_at_once  # each stage's search stays sequential
    assert result.best is not None


def test_extra_micro_batches_of_a_stage_fill_slots_that_would_idle(tuner_factory):
    # Two stages on four slots: the stages' searches take two, and the smaller micro-batches
    # the comparison would measure later take the others. No configuration runs twice.
    launcher = SlowFake(target=4)
    tuner = tuner_factory(
        launcher=launcher,
        node=Node("cuda", 8, 16 * GIB, 64 * GIB),
        config={"zero_optimization": {"stage": [2, 3]}},
    )
    result = tuner.tune()
    assert launcher.peak == 4 and launcher.same_stage_at_once
    names = [j.spec.name for j in launcher.jobs if not j.trial_dir.name.startswith("confirm")]
    assert len(names) == len(set(names)) and result.best is not None


def test_trials_already_running_are_told_of_a_new_best(tuner_factory, monkeypatch):
    import zerotune.tuning._loop as loop
    from fakes import FakeLauncher

    told = threading.Condition()
    written = loop.write_json

    def write_and_tell(path, data):
        written(path, data)
        with told:
            told.notify_all()

    monkeypatch.setattr(loop, "write_json", write_and_tell)

    class WaitsForTheLeader(FakeLauncher):
        """The first trial ends at once; each other waits until the tuner tells it the best."""

        def __init__(self):
            super().__init__()
            self.lock, self.started, self.seen = threading.Lock(), 0, {}

        def run(self, job):
            with self.lock:
                self.started += 1
                first = self.started == 1
            if not first:
                path = job.trial_dir / "to_beat.json"
                with told:
                    assert told.wait_for(path.exists, timeout=60)
                self.seen[job.spec.name] = json.loads(path.read_text())
            return super().run(job)

    launcher = WaitsForTheLeader()
    tuner = tuner_factory(
        launcher=launcher,
        node=Node("cuda", 8, 16 * GIB, 64 * GIB),
        config={"zero_optimization": {"stage": [0, 1, 2, 3]}, "train_micro_batch_size_per_gpu": [8]},
    )
    result = tuner.tune()
    leader = result.trials[0].metric("throughput")  # the trial that ended at once
    assert len(launcher.seen) >= 3
    assert all(t["metric"] == "throughput" for t in launcher.seen.values())
    assert any(abs(t["value"] - leader) < 1e-9 for t in launcher.seen.values())
