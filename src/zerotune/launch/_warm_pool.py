"""Warm trials: rank processes launched once serve many trials on one slot (the probe's serve
mode re-runs the user's script for each). Start-up (the launcher, imports, DeepSpeed's op loads,
the process group) is paid once per group instead of once per trial.

A group is retired (its processes ended; the next trial on its slot starts cold) when a trial
ends other than cleanly (OOM, crash, hang, timeout), when any rank's teardown or leak check
fails, when the next trial needs a different process signature (world size, devices,
environment), or after ``cap`` trials. The result of the trial that retired it stands.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._files import write_atomic, write_json
from ..trials import TrialResult
from ._base import TrialJob
from ._collect import collect
from ._oom_kills import oom_kill_count, oom_kills_since
from ._process import ProcessGroup, stalled

FAILED_RANK_GRACE = 2.0
"""Seconds the other ranks get to report once one rank's trial failed: they may wait in a
collective that never completes."""


@dataclass(kw_only=True)
class WarmGroup:
    """One launch of a slot's rank processes in serve mode."""

    pool: Path
    """Its folder (orders, done files, the launcher's log, the ranks' output between trials)."""
    group: ProcessGroup
    port: int
    signature: str
    world: int
    started_as: str
    seq: int = 0
    """The number of the next order."""
    idle: bool = False
    """Every rank reported its last trial ended cleanly and waits for the next order: nothing
    of theirs is left to finish, so retiring them needs no grace."""

    @property
    def alive(self) -> bool:
        return self.group.proc.poll() is None

    def order(self, probe: Path, kind: str) -> None:
        self.idle = False
        write_json(self.pool / f"order{self.seq}.json", {"probe": str(probe), "kind": kind})

    def done(self) -> list[dict[str, Any] | None]:
        out = []
        for r in range(self.world):
            try:
                out.append(json.loads((self.pool / f"done{self.seq}.rank{r}.json").read_text()))
            except (OSError, ValueError):
                out.append(None)
        return out

    def log_size(self) -> int:
        try:
            return (self.pool / "launcher.log").stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        try:
            with open(self.pool / "launcher.log", "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def signature(job: TrialJob, env: dict[str, str]) -> str:
    """What warm processes must share with a trial to serve it: world size, devices, the launcher
    that started them, environment (the tuner's own pid and the trial's probe path aside, which
    the ranks do not read)."""
    slot = job.slot
    return json.dumps(
        [
            job.num_gpus,
            list(slot.devices) if slot else None,
            bool(slot and slot.pinned),
            repr(job.program_launcher),  # a dataclass's repr: equal launchers, equal text
            sorted((k, v) for k, v in env.items() if k not in ("ZEROTUNE_PROBE",)),
        ]
    )


def kind_of(config: dict[str, Any]) -> str:
    """The kind of a trial for the leak baselines: its stage and offload devices."""
    zero = config.get("zero_optimization") or {}
    parts = [f"z{zero.get('stage', 0)}"]
    for key in ("offload_optimizer", "offload_param"):
        device = (zero.get(key) or {}).get("device") if isinstance(zero.get(key), dict) else None
        if device and device != "none":
            parts.append(f"{key}={device}")
    return "+".join(parts)


def run_in_group(warm: WarmGroup, job: TrialJob, d: Path) -> tuple[TrialResult, str]:
    """Run ``job`` (its probe.json written in ``d``) in ``warm``; the result and why the group
    must retire ("" when it can serve the next trial)."""
    m = job.measure
    offset = warm.log_size()
    index = warm.seq + 1
    write_atomic(
        d / "cmd.txt",
        f"# ran warm: trial {index} of the processes started as (their output between "
        f"trials is in {warm.pool}):\n{warm.started_as}",
    )
    write_atomic(d / "launcher.log", f"zerotune: trial {index} of the warm processes in {warm.pool}\n")
    start = time.monotonic()
    kills_before = oom_kill_count()
    warm.order(d / "probe.json", kind_of(job.config))
    timed_out, hung, failed_at = False, None, None
    while True:
        done = warm.done()
        if all(x is not None for x in done) or not warm.alive:
            break
        if any(x is not None and not x["clean"] for x in done):
            failed_at = failed_at or time.monotonic()
            if time.monotonic() - failed_at > FAILED_RANK_GRACE:
                break
        if time.monotonic() - start > m.trial_timeout:
            timed_out = True
            break
        if (hung := stalled(d, warm.world, m.stall_timeout)) is not None:
            break
        time.sleep(0.05)
    wall = time.monotonic() - start
    done = warm.done()
    code = warm.group.proc.poll()
    if not warm.alive or timed_out or hung:
        with open(d / "launcher.log", "a") as f:
            f.write(warm.log_since(offset))
    for record in warm.pool.glob("rank*.exit"):  # how a rank died, as its waiter recorded it
        os.replace(record, d / record.name)
    result = collect(
        spec=job.spec,
        trial_dir=d,
        world=warm.world,
        returncode=code,
        timed_out=timed_out,
        timeout=m.trial_timeout,
        wall_time=wall,
        budget=job.budget,
        min_steps=job.min_steps,
        rel_ci=m.precision,
        hung=hung,
        oom_kills=oom_kills_since(kills_before),
    )
    why = next((x["why"] for x in done if x is not None and not x["clean"]), "")
    if not why and None in done:
        why = result.reason or ("the processes ended" if code is not None else "no rank finished its teardown")
    warm.seq += 1
    warm.idle = not why and warm.alive and all(x is not None and x["clean"] for x in done)
    return result, why


def started_as_text(argv: list[str], pool: Path) -> str:
    return " ".join(shlex.quote(w) for w in [f"ZEROTUNE_PROBE={pool / 'serve.json'}", *argv]) + "\n"
