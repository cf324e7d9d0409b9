"""How a trial's processes start, apart from what is tried (search) and when to stop (tuner)."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..trials import MeasureSettings, TrialResult, TrialSpec
from ._slots import Slot


class ProgramLauncher(abc.ABC):
    """A program's own launcher (a target provides it), which starts a trial's ranks on this node
    in place of DeepSpeed's per-node launcher. Equal launchers start the same processes (warm
    processes are reused only by a trial whose launcher equals theirs)."""

    @abc.abstractmethod
    def argv(self, num_gpus: int, port: int, devices: list[int] | None) -> list[str]:
        """The command that starts ``python -m zerotune.probe`` in ``num_gpus`` processes on this
        node, rendezvous on ``port``, on ``devices`` (GPU ids; None: on CPU). The user's
        arguments are not in it: the probe reads them from the trial folder."""


@dataclass(kw_only=True)
class TrialJob:
    """Everything a launcher needs to run one trial."""

    spec: TrialSpec
    trial_dir: Path
    script: str
    script_args: list[str]
    """The user's arguments with the config path (and arg_mappings) replaced for this trial."""
    local_rank_arg: bool
    num_gpus: int
    budget: int | None
    warmup_steps: int
    """Optimizer steps before timing starts, or (``adaptive_warmup``) the fewest there are."""
    min_steps: int
    adaptive_warmup: bool = False
    """End warm-up when step times settle (see probe settled_at) instead of after ``warmup_steps``."""
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    """The measurement policy: precision, the time cap, step bounds, the timeouts."""
    window_seconds: float | None = None
    """A re-measurement's window (measure.window_seconds): it measures that long, then on only
    while its comparison (``settle``) stays open, up to the time cap; None for a trial."""
    to_beat: dict[str, Any] | None = None
    """{"metric": "throughput"|"latency", "value": v, "rel_se": r, "df": d}: the trial may stop
    measuring as soon as it clearly cannot beat v, the best trial's figure so far, measured with
    relative standard error r on d degrees of freedom (None: exact)."""
    settle: dict[str, Any] | None = None
    """A re-measurement's comparison to answer (see tuning.confirm.settle_target): it measures on past
    its window until the choice between it and the candidate leading so far is settled, while
    more of its steps can settle it, up to the time cap (measure.max_measure_seconds). Keys:
    ``maximize``, the leader's ``value``, ``ci``, ``rel_se``, ``df`` (None: exact), ``scale``
    (metric x step time of this config; None for latency), ``margin``."""
    env: dict[str, str] = field(default_factory=dict)
    slot: Slot | None = None
    """The devices (or pinned cores) this trial runs on; None: the first ``num_gpus`` devices."""
    config: dict[str, Any] = field(default_factory=dict)
    """The trial's ds_config: with the tuning's identity, what its result is stored under."""
    warm: bool = False
    """Run in the slot's warm processes (launched once, serving trial after trial) where the
    launcher has them; else in processes of its own."""
    work_dir: Path | None = None
    """The results folder: where the launcher keeps what outlives one trial (the warm processes'
    folders); None: the trial folder's parent."""
    cold_reason: str = ""
    """Why the trial runs cold although warm trials were asked for (said in the summary)."""
    probe_fields: dict[str, Any] = field(default_factory=dict)
    """What the target adds to probe.json to give the run its config (a Lightning program's
    ``lightning_config``, read by the probe's Lightning hooks; ``env`` the probe sets for the run)."""
    program_launcher: ProgramLauncher | None = None
    """The program's own launcher, which then starts the ranks instead of DeepSpeed's per-node
    launcher (a target's, see Target.program_launcher); None: DeepSpeed's."""

    def probe_spec(self, trial_dir: Path) -> dict[str, Any]:
        """What zerotune.probe reads in each rank (probe.json): the script, its arguments and
        how to measure."""
        return {
            "mode": "measure",
            "script": self.script,
            "args": self.script_args,
            "local_rank_arg": self.local_rank_arg,
            "out_dir": str(trial_dir),
            "results_dir": str((self.work_dir or trial_dir.parent).resolve()),
            "budget": self.budget,
            "warmup_steps": self.warmup_steps,
            "adaptive_warmup": self.adaptive_warmup,
            "min_steps": self.min_steps,
            "max_steps": self.measure.max_steps,
            "max_warmup": self.measure.max_warmup_steps,
            "max_seconds": self.measure.max_measure_seconds,
            "window_seconds": self.window_seconds,
            "rel_ci": self.measure.precision,
            "to_beat": self.to_beat,
            "settle": self.settle,
            "expect": {
                "stage": self.spec.stage,
                "micro_batch": self.spec.micro_batch,
                "grad_accum": self.spec.grad_accum,
            },
            **self.probe_fields,
        }


class TrialPool:
    """Trials side by side: :meth:`submit` starts one, :meth:`wait_any` returns those of the
    given futures that have finished (at least one). Each trial runs in a thread of its own; a
    simulated launcher's pool runs them on its virtual clock instead (see Launcher.trial_pool)."""

    def __init__(self, workers: int):
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zerotune-trial")

    def submit(self, run: Callable[[TrialJob], TrialResult], job: TrialJob) -> Future:
        return self._threads.submit(run, job)

    def wait_any(self, futures: Iterable[Future]) -> set[Future]:
        done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
        return done

    def shutdown(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)


class Launcher(abc.ABC):
    """Runs one trial to completion and classifies how it ended. Must never raise for a trial
    that fails: failures are results (state crashed, oom, timeout). ``run`` may be called from
    several threads at once, one per slot."""

    @abc.abstractmethod
    def run(self, job: TrialJob) -> TrialResult: ...

    def preflight(self) -> None:
        """Check, before any trial, that trials can start at all (tools installed, hosts
        reachable); raise a ZerotuneError that says what to fix. A host of the pool that the
        training does not need and that cannot be reached leaves it (see :attr:`dropped`)."""

    def check_storage(self, results_dir: Path) -> None:
        """Check, before any trial and after :meth:`preflight`, that every node of the pool writes
        where this process reads: each writes a marker into ``results_dir``, read back here. A node
        that fails leaves the pool (see :attr:`dropped`); one the training needs is an error.
        Nothing to check on one node."""

    dropped: dict[str, str] = {}
    """Hosts that left the pool of a multi-node launcher, and why: no trial runs on them."""

    def run_program(
        self, probe_spec: Path, num_gpus: int, extra_env: dict[str, str], program: ProgramLauncher | None = None
    ) -> int:
        """Start the probe in ``run`` mode (the user's real training) on every rank of the
        trials' topology, output to this terminal; wait for it and return its exit status."""
        raise NotImplementedError(f"{type(self).__name__} cannot run the training")

    def close(self) -> None:
        """End anything still running (called on Ctrl-C and at exit)."""

    def trial_pool(self, workers: int) -> TrialPool:
        """Where :meth:`run` runs for trials side by side, ``workers`` at most at once."""
        return TrialPool(workers)

    def now(self) -> float:
        """Seconds on the clock the trials run by: the tuning's time budget and wall time are
        read from it (a simulated launcher's is virtual)."""
        return time.monotonic()
