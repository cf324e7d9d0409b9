"""Fakes for driving the in-process probe without DeepSpeed: an engine, a clock, steps."""

from __future__ import annotations

from types import SimpleNamespace


class FakeEngine:
    device = SimpleNamespace(type="cpu")

    def __init__(self, stage=2, mb=4, gas=1):
        self.stage, self.mb, self.gas = stage, mb, gas
        self.module = SimpleNamespace(parameters=lambda: [])

    def zero_optimization_stage(self):
        return self.stage

    def train_micro_batch_size_per_gpu(self):
        return self.mb

    def gradient_accumulation_steps(self):
        return self.gas

    def train_batch_size(self):
        return self.mb * self.gas * 2


class Exited(Exception):
    """What the probe's os._exit raises instead (see the probe_factory fixture)."""


def make_probe_factory(tmp_path, monkeypatch):
    """make(step_times, **spec): a rank-0 probe whose clock reads ``step_times`` in turn."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from zerotune.probe import _hooks

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(_hooks.os, "_exit", fake_exit)

    def make(step_times, history=None, faults=None, **spec):
        """``history``: a warm process's (see ProcessHistory); None: a cold process. ``faults``:
        the process's minor page faults read at each step's end in turn (none: a heap that never
        grows, so that the test process's own allocations decide nothing)."""
        ticks = iter(step_times)
        monkeypatch.setattr(_hooks.time, "perf_counter", lambda: next(ticks))
        pages = iter(faults if faults is not None else [])
        monkeypatch.setattr(_hooks, "minor_faults", lambda: next(pages, 0))
        spec = {
            "out_dir": str(tmp_path),
            "warmup_steps": 2,
            "min_steps": 3,
            "max_steps": 50,
            "max_warmup": 10,
            "max_seconds": 1e9,
            "rel_ci": 0.03,
            "budget": None,
            "expect": {"stage": 2, "micro_batch": 4, "grad_accum": 1},
            "profile_flops": False,
            **spec,
        }
        return _hooks.StepProbe(spec, rank=0, history=history)

    return make


def drive(probe, engine, steps):
    import torch

    for _ in range(steps):
        probe.before_forward(engine, (torch.zeros(4, 16, dtype=torch.long),), {})
        probe.after_step(engine)


def drive_micro(probe, engine, durations):
    """Micro-steps of the given durations (the fake clock advances by each); every
    ``engine.gas``-th one is a boundary."""
    import torch

    for i, _ in enumerate(durations):
        probe.before_forward(engine, (torch.zeros(4, 16, dtype=torch.long),), {})
        if (i + 1) % engine.gas:
            probe.after_micro(engine)
        else:
            probe.after_step(engine)


def clock(durations, start=0.0):
    """Step end times: ``start``, then after each of ``durations``."""
    out, t = [start], start
    for d in durations:
        t += d
        out.append(t)
    return out
