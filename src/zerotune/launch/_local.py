"""Trials on this node through DeepSpeed's own per-node launcher: no ssh, no pdsh, no hostfile."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._files import write_atomic, write_json
from ..trials import TrialResult, TrialState
from ._base import ProgramLauncher, TrialJob
from ._collect import port_in_use
from ._leftovers import note_port, remove_shm_buffers
from ._process import ProcessGroup, free_port, ranks_argv, trial_env
from ._slots import visible_gpus
from ._supervise import SupervisingLauncher, clear_rank_files
from ._warm_pool import WarmGroup, run_in_group, signature, started_as_text

PORT_ATTEMPTS = 3
WARM_CAP = 24
"""Trials one launch of warm processes serves before it is retired and the next starts cold."""
WARM_DIR = "_warm"
NEAR_BUDGET = 0.85
"""A warm trial whose peak is at least this share of the memory budget is measured again cold:
a warm CPU peak reads high (memory the process kept from earlier trials)."""


class LocalLauncher(SupervisingLauncher):
    """Trials on this node, each in its slot (the tuner runs one per slot at a time). A job with
    ``warm`` set runs in the slot's warm processes (started by the first such trial), see _warm_pool."""

    def __init__(self, *, device: str, warm_cap: int = WARM_CAP):
        super().__init__(device=device)
        self.warm_cap = warm_cap
        self._warm: dict[int, WarmGroup] = {}
        self._pools = 0
        self._spawner: ThreadPoolExecutor | None = None
        """Starts warm processes: they are told to die with the thread that started them
        (die_with_parent), so it must outlive the trial threads, which end with each phase."""

    def run(self, job: TrialJob) -> TrialResult:
        extra = {}
        if job.slot is not None and job.slot.pinned:  # a share of the cores: one thread per core each
            extra["OMP_NUM_THREADS"] = job.env.get(
                "OMP_NUM_THREADS", str(max(1, len(job.slot.devices) // job.num_gpus))
            )
        d, env = self.prepare(job, extra)
        if job.warm:
            return self._run_warm(job, d, env)
        self.retire(_slot_key(job), "a cold trial needs its slot")
        result = self._run_cold(job, d, env)
        result.start = "cold" + (f": {job.cold_reason}" if job.cold_reason else "")
        return result

    def _run_cold(self, job: TrialJob, d: Path, env: dict[str, str]) -> TrialResult:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            result = self.attempt(job, d, env, free_port())
            if attempt == PORT_ATTEMPTS or result.state is not TrialState.CRASHED or not port_in_use(d, job.num_gpus):
                return result
            # Another process took the port between our check and the rendezvous: a fresh port,
            # not a failed configuration.
            os.replace(d / "launcher.log", d / f"launcher.attempt{attempt}.log")
            write_atomic(
                d / "launcher.log",
                f"zerotune: the master port was in use (launcher.attempt{attempt}.log); "
                f"retrying on another port, attempt {attempt + 1}\n",
            )
            clear_rank_files(d)
        raise AssertionError("unreachable")

    def start(self, job: TrialJob, d: Path, env: dict[str, str], port: int) -> list[ProcessGroup]:
        slot = job.slot
        gpus = (
            list(slot.devices)
            if slot is not None and self.device == "cuda"
            else (visible_gpus(job.num_gpus) if self.device == "cuda" else None)
        )
        argv = ranks_argv(job.program_launcher, job.num_gpus, port, gpus)
        ranks_see = [job.script] + (["--local_rank=<rank>"] if job.local_rank_arg else []) + job.script_args
        write_atomic(
            d / "cmd.txt",
            "# started as (the user's arguments are read from probe.json, never parsed by the launcher):\n"
            + " ".join(shlex.quote(w) for w in [f"ZEROTUNE_PROBE={d / 'probe.json'}", *argv])
            + "\n"
            + "# each rank runs:\n"
            + " ".join(shlex.quote(w) for w in ranks_see)
            + "\n",
        )
        return [
            ProcessGroup(
                argv, env=env, log=d / "launcher.log", cores=slot.devices if slot is not None and slot.pinned else None
            )
        ]

    def release(self, port: int) -> None:
        remove_shm_buffers(port)

    # -- warm trials ---------------------------------------------------------------------------
    def _run_warm(self, job: TrialJob, d: Path, env: dict[str, str]) -> TrialResult:
        key, sig = _slot_key(job), signature(job, env)
        warm = self._warm.get(key)
        if warm is not None and (why := self._unfit(warm, sig)):
            self.retire(key, why)
            warm = None
        for attempt in range(1, PORT_ATTEMPTS + 1):
            launched = 0.0
            if warm is None:
                t0 = time.monotonic()
                warm = self._start_group(job, d, env, sig)
                launched = time.monotonic() - t0
            first = warm.seq == 0
            result, why = run_in_group(warm, job, d)
            result.wall_time += launched
            result.start = (
                "cold (new warm processes; later trials reuse them)"
                if first
                else f"warm (trial {warm.seq} of its processes)"
            )
            if (
                first
                and result.state is TrialState.CRASHED
                and port_in_use(d, job.num_gpus)
                and attempt < PORT_ATTEMPTS
            ):
                self.retire(key, "the master port was in use")
                warm = None
                clear_rank_files(d)
                continue
            if why:
                result.retired = why
                self.retire(key, why)
            if near_budget(result, job.budget) and not first:
                # The first trial of new processes ran as a cold one does: nothing before it in
                # them, so its peak is a cold peak. Later ones may read memory kept from earlier trials.
                return self._remeasure_cold(job, d, env, result)
            return result
        raise AssertionError("unreachable")

    def _remeasure_cold(self, job: TrialJob, d: Path, env: dict[str, str], warm: TrialResult) -> TrialResult:
        from ..units import format_size

        self.retire(_slot_key(job), "a trial near the memory budget is measured again cold")
        os.makedirs(d / "warm", exist_ok=True)
        for f in list(d.glob("rank*.*")) + [d / "cmd.txt", d / "launcher.log"]:
            if f.exists():
                os.replace(f, d / "warm" / f.name)
        result = self._run_cold(job, d, env)
        where = (
            "above" if (warm.max_peak or 0) > (job.budget or 0) else f"within {1 - NEAR_BUDGET:.0%} of"
        )  # an OOM is measured again too
        result.start = (
            f"cold: measured again in processes of its own, as its warm peak "
            f"{format_size(warm.max_peak)} was {where} the budget "
            f"{format_size(job.budget)} (a warm peak reads high; the warm run is in warm/)"
        )
        result.wall_time += warm.wall_time
        return result

    def _unfit(self, warm: WarmGroup, sig: str) -> str:
        if not warm.alive:
            return "its processes ended"
        if warm.signature != sig:
            return "the next trial needs other processes (world size, devices or environment)"
        if warm.seq >= self.warm_cap:
            return f"it served {warm.seq} trials, the most one launch serves"
        return ""

    def _start_group(self, job: TrialJob, d: Path, env: dict[str, str], sig: str) -> WarmGroup:
        root = (job.work_dir or d.parent) / WARM_DIR
        with self._lock:  # slots start their groups from their own threads
            if self._pools == 0 and root.is_dir() and not root.is_symlink():
                shutil.rmtree(root, ignore_errors=True)  # an earlier tuning's pools: logs only
            if root.is_symlink() or (root.exists() and not root.is_dir()):
                root.unlink()  # zerotune's own name in the results folder: a link or file there is replaced
            self._pools += 1
            pool = root / f"slot{_slot_key(job)}-{self._pools}"
            pool.mkdir(parents=True, exist_ok=True)
        write_json(pool / "serve.json", {"mode": "serve", "pool": str(pool)})
        slot = job.slot
        gpus = (
            list(slot.devices)
            if slot is not None and self.device == "cuda"
            else (visible_gpus(job.num_gpus) if self.device == "cuda" else None)
        )
        port = free_port()
        note_port(job.work_dir or d.parent, port)
        argv = ranks_argv(job.program_launcher, job.num_gpus, port, gpus)
        with self._lock:
            if self._spawner is None:
                self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerotune-warm")
            spawner = self._spawner
        group = spawner.submit(
            ProcessGroup,
            argv,
            env={**env, "ZEROTUNE_PROBE": str(pool / "serve.json")},
            log=pool / "launcher.log",
            cores=slot.devices if slot is not None and slot.pinned else None,
        ).result()
        warm = WarmGroup(
            pool=pool, group=group, port=port, signature=sig, world=job.num_gpus, started_as=started_as_text(argv, pool)
        )
        with self._lock:
            self._running.add(group)
        self._warm[_slot_key(job)] = warm
        return warm

    def retire(self, key: int, why: str) -> None:
        """End the warm processes of slot ``key`` (if any)."""
        warm = self._warm.pop(key, None)
        if warm is None:
            return
        with self._lock:
            self._running.discard(warm.group)
        # The processes and their buffers go first: the note below can fail (a full disk).
        warm.group.kill(grace=0.0 if warm.idle else 3.0)
        remove_shm_buffers(warm.port)
        write_atomic(warm.pool / "retired.txt", why + "\n")

    def close(self) -> None:
        for key in list(self._warm):
            self.retire(key, "the tuning ended")
        super().close()
        with self._lock:
            spawner, self._spawner = self._spawner, None
        if spawner is not None:
            spawner.shutdown(wait=True)

    def run_program(
        self, probe_spec: Path, num_gpus: int, extra_env: dict[str, str], program: ProgramLauncher | None = None
    ) -> int:
        env = trial_env(num_gpus, self.device, {**extra_env, "ZEROTUNE_PROBE": str(probe_spec.resolve())})
        port = free_port()
        gpus = visible_gpus(num_gpus) if self.device == "cuda" else None
        group = ProcessGroup(ranks_argv(program, num_gpus, port, gpus), env=env, log=None)
        try:
            group.proc.wait()
        finally:
            group.kill()
            remove_shm_buffers(port)
        return group.proc.returncode or 0


def near_budget(result: TrialResult, budget: int | None) -> bool:
    """A peak reading that decides (or nearly decides) the trial's fate: OK near the budget, or
    out of memory only by the budget check (not a real allocation failure)."""
    peak = result.max_peak
    if not budget or not peak or peak < NEAR_BUDGET * budget:
        return False
    return result.state is TrialState.OK or (result.state is TrialState.OOM and "above the budget" in result.reason)


def _slot_key(job: TrialJob) -> int:
    return job.slot.index if job.slot is not None else 0
