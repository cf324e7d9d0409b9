"""Turn what a trial left in its folder (per-rank JSON, logs, exit status) into a TrialResult."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
from pathlib import Path
from typing import Any

from .._proc import exit_file, read_exit
from ..trials import (
    Measurement,
    TrialResult,
    TrialSpec,
    TrialState,
    estimate_is_stable,
    is_stable,
    split_disturbed,
    summarize,
)
from ..units import format_size
from ._build_locks import lock_hint

_OOM_TEXT = re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.IGNORECASE)
_RETURN_CODE = re.compile(r"exits with return code = (-?\d+)|exitcode\s*:\s*(-?\d+)")
_PORT_IN_USE = re.compile(r"address already in use|EADDRINUSE", re.IGNORECASE)
KNOWN_FIXES = (
    (
        re.compile(r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* world_size"),
        "the script filled train_batch_size for another number of processes (Hugging Face's Trainer does so with "
        '"train_batch_size": "auto" on CPU); leave train_batch_size out of the ds_config',
    ),
    (
        re.compile(r"DeepSpeed config values that mismatch TrainingArguments"),
        "the Trainer's arguments disagree with the trial's batch values; set the batch values to \"auto\" in the "
        "ds_config, or map them to the script's options with autotuning.arg_mappings",
    ),
)
"""Errors whose fix is known: (what the error says, what to do)."""
_ARCH_INT_ERROR = re.compile(r"invalid literal for int\(\) with base 10: '\d*[a-z]")
_ARCH_SUFFIXED = re.compile(r"\d[a-z]")


def _arch_list_fix() -> str:
    """DeepSpeed's JIT op build (0.19) sorts TORCH_CUDA_ARCH_LIST's entries as numbers and fails
    on an architecture-specific one such as 9.0a, which CUDA images of Hopper machines set: seen
    on a lent H200, where every trial that builds FusedAdam crashed with only that ValueError."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    if not _ARCH_SUFFIXED.search(arch):
        return ""
    plain = ";".join(dict.fromkeys(re.sub(r"(\d)[a-z]+", r"\1", a) for a in re.split(r"[;\s]+", arch) if a))
    return (
        f"DeepSpeed's JIT op build cannot read TORCH_CUDA_ARCH_LIST={arch} (an architecture-specific entry); "
        f"set TORCH_CUDA_ARCH_LIST={shlex.quote(plain)}, or unset it to build for the GPUs present"
    )


def known_fix(reason: str) -> str:
    """``reason`` with the fix of a known error added."""
    fixes = [fix for pattern, fix in KNOWN_FIXES if pattern.search(reason)]
    if _ARCH_INT_ERROR.search(reason):
        fixes.append(_arch_list_fix())
    for fix in fixes:
        if fix and fix not in reason:
            return f"{reason}; fix: {fix}"
    return reason


def _read_ranks(trial_dir: Path, world: int) -> list[dict | None]:
    ranks = []
    for r in range(world):
        path = trial_dir / f"rank{r}.json"
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            ranks.append(None)
    return ranks


def _last_error_line(trial_dir: Path, world: int) -> str:
    for r in range(world):
        path = trial_dir / f"rank{r}.stderr"
        if not path.exists():
            continue
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        errs = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", ln)]
        if errs:
            return f"rank {r}: {errs[-1][:300]}"
    return ""


def _stderr_has_oom(trial_dir: Path, world: int) -> bool:
    # Only the last lines: an OOM that was caught and survived earlier is not this trial's end.
    for r in range(world):
        path = trial_dir / f"rank{r}.stderr"
        if path.exists() and _OOM_TEXT.search("\n".join(path.read_text(errors="replace").splitlines()[-40:])):
            return True
    return False


def _signal_name(num: int) -> str:
    try:
        name = signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
    return name + (" (a segmentation fault: a bug in native code, not a config problem)" if name == "SIGSEGV" else "")


_FATAL = re.compile(
    r"Fatal Python error: (Segmentation fault|Aborted|Floating point exception|Bus error|"
    r"Illegal instruction)"
)
_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}


def _missing_cause(trial_dir: Path, ranks: list[dict | None], *, generic: bool) -> str | None:
    """Why ranks ended without reporting: a fatal signal that Python's faulthandler wrote to the
    rank's stderr, else the signal the first of them to die was killed by (its waiter's record,
    see the probe's waiter), else a signal the launcher's log names for the first failing process it
    found (:data:`SIGKILL` for that signal, whose sender :func:`_sigkilled` tells), else
    (``generic``) which rank went silent. None when every rank reported, or when nothing
    specific is known and not ``generic``."""
    missing = [r for r, data in enumerate(ranks) if data is None]
    if not missing:
        return None
    for r in missing:
        path = trial_dir / f"rank{r}.stderr"
        m = _FATAL.search(path.read_text(errors="replace")[-20000:]) if path.exists() else None
        if m:
            sig = _FATAL_SIGNALS[m.group(1)]
            return (
                f"rank {r} was killed by {_signal_name(signal.Signals[sig].value)}; its Python stack is in "
                f"rank{r}.stderr"
            )
    # SIGTERM and SIGINT are the clean-up's (the launcher's, zerotune's) once a rank has failed.
    deaths = sorted(
        (exit_file(trial_dir, r).stat().st_mtime, r, sig)
        for r in missing
        if (sig := read_exit(trial_dir, r)) not in (None, signal.SIGTERM, signal.SIGINT)
    )
    if deaths:
        _, r, sig = deaths[0]  # the first to die; the others are ended after it
        return SIGKILL if sig == signal.SIGKILL else f"rank {r} was killed by {_signal_name(sig)}"
    log = trial_dir / "launcher.log"
    codes = [int(a or b) for a, b in _RETURN_CODE.findall(log.read_text(errors="replace"))] if log.exists() else []
    first = next((c for c in codes if c), None)
    if first == -9:
        return SIGKILL
    if first is not None and first < 0:
        return f"a rank was killed by {_signal_name(-first)}"
    if generic:
        return f"rank {missing[0]} ended without reporting a result" + (
            f" (a process exited with status {first})" if first else ""
        )
    return None


SIGKILL = "SIGKILL"
NEAR_LIMIT = 0.9
"""A rank killed by SIGKILL with a peak at least this share of the memory budget, where the
kernel's count of OOM kills cannot be read, is taken as killed for memory."""


def _sigkilled(result: TrialResult, oom_kills: int | None, budget: int | None, then: str = "") -> TrialResult:
    """The verdict on a rank killed by SIGKILL: out of memory where the kernel counted an OOM
    kill during the trial (or, where it keeps no count, where the peak was near the budget);
    else killed from outside, which says nothing of the configuration's memory."""
    peak = result.max_peak
    near = bool(budget and peak and peak >= NEAR_LIMIT * budget)
    if oom_kills:
        result.state = TrialState.OOM
        reason = (
            f"a rank was killed by the kernel's out-of-memory killer ({oom_kills} OOM kill(s) counted in "
            "the memory cgroup during the trial)"
        )
    elif oom_kills is None and near:
        result.state = TrialState.OOM
        reason = (
            f"a rank was killed by SIGKILL at a peak of {format_size(peak)} against the budget of "
            f"{format_size(budget)}: most likely the kernel's out-of-memory killer"
        )
    else:
        result.state = TrialState.KILLED
        evidence = (
            "the kernel counted no out-of-memory kill"
            if oom_kills == 0
            else f"its peak {format_size(peak)} was far below the budget {format_size(budget)}"
            if peak and budget
            else "no sign of an out-of-memory kill"
        )
        reason = (
            f"a rank was killed by SIGKILL from outside zerotune ({evidence}): not a verdict on the "
            "configuration, which a rerun measures again"
        )
    result.reason = f"{reason}; then {then}" if then else reason
    return result


def port_in_use(trial_dir: Path, world: int) -> bool:
    """The rendezvous failed because the master port was taken."""
    logs = [trial_dir / "launcher.log"] + [trial_dir / f"rank{r}.stderr" for r in range(world)]
    return any(p.exists() and _PORT_IN_USE.search(p.read_text(errors="replace")[-20000:]) for p in logs)


def collect(**kw) -> TrialResult:
    """The result of a finished trial (see :func:`_collect`), a known error's fix named in its reason."""
    result = _collect(**kw)
    if result.state is TrialState.CRASHED and result.reason:
        result.reason = known_fix(result.reason)
    return result


def _collect(
    *,
    spec: TrialSpec,
    trial_dir: Path,
    world: int,
    returncode: int | None,
    timed_out: bool,
    timeout: float,
    wall_time: float,
    budget: int | None,
    min_steps: int,
    rel_ci: float,
    hung: str | None = None,
    oom_kills: int | None = None,
) -> TrialResult:
    """``hung``: why the launcher ended a trial that stopped making progress. ``oom_kills``: the
    OOM kills the kernel counted during the trial (None: unknown)."""
    ranks = _read_ranks(trial_dir, world)
    present = [r for r in ranks if r is not None]
    result = TrialResult(spec=spec, state=TrialState.CRASHED, wall_time=wall_time, budget=budget)
    if present:
        result.peak_memory = [int(r["peak_memory"]) for r in present if r.get("peak_memory") is not None]
        result.peak_allocated = [int(r["peak_allocated"]) for r in present if r.get("peak_allocated") is not None]
        result.static_memory = [int(r["static_memory"]) for r in present if r.get("static_memory") is not None]
        result.memory_kind = present[0].get("memory_kind") or ""
        result.num_params = present[0].get("num_params")
        result.losses = mean_losses(present)
    states = {r["state"] for r in present}
    reasons = list(dict.fromkeys(r["reason"] for r in present if r.get("reason")))  # each rank says the same
    if "oom" in states:
        result.state, result.reason = TrialState.OOM, next(r["reason"] for r in present if r["state"] == "oom")
        return result
    if hung:
        result.state, result.reason = TrialState.TIMEOUT, hung
        return result
    if timed_out:
        result.state, result.reason = TrialState.TIMEOUT, f"no result within the trial timeout of {timeout:.0f} s"
        if not present and not any((trial_dir / f"rank{r}.progress").exists() for r in range(world)):
            result.reason += lock_hint()  # never reached a forward: maybe waiting on a stale build lock
        return result
    # A rank that died without reporting (a signal, os._exit) is the cause; what the others
    # then report (a broken connection in a collective) is only the consequence.
    if "crashed" in states:
        cause = _missing_cause(trial_dir, ranks, generic=True)
        reported = next(r["reason"] for r in present if r["state"] == "crashed")
        if cause == SIGKILL:
            return _sigkilled(result, oom_kills, budget, then=reported)
        result.reason = f"{cause}; then {reported}" if cause else reported
        return result
    rank0 = ranks[0]
    if rank0 is None or len(present) < world:
        if _stderr_has_oom(trial_dir, world):
            result.state, result.reason = (
                TrialState.OOM,
                "out of memory (" + (_last_error_line(trial_dir, world) or "see rank stderr") + ")",
            )
            return result
        cause = _missing_cause(trial_dir, ranks, generic=False)
        if cause == SIGKILL:
            return _sigkilled(result, oom_kills, budget)
        detail = (
            cause
            or _last_error_line(trial_dir, world)
            or _missing_cause(trial_dir, ranks, generic=True)
            or f"the launcher exited with status {returncode}"
        )
        result.reason = f"{detail} (see {trial_dir}/rank*.stderr)"
        return result
    intervals = rank0.get("intervals") or []
    if not intervals:
        n = len(rank0.get("times") or [])
        result.reason = (
            f"the script ended after {n} optimizer steps, before any step after the "
            f"{rank0.get('warmup_steps')} warm-up steps; let it train longer"
        )
        return result
    # The probe's own split (it stopped on the same figure): disturbances left out, see split_disturbed.
    timed = split_disturbed(intervals)
    mean, std, ci = summarize(timed.kept)
    df: float | None = len(timed.kept) - 1.0
    stable = is_stable(timed.kept, min_steps=min_steps, rel_ci=rel_ci)
    left_out = {"left_out": timed.left_out, "left_out_median": timed.median if timed.left_out else None}
    estimate = rank0.get("estimate")
    if (
        isinstance(estimate, list)
        and len(estimate) == 3
        and all(isinstance(v, (int, float)) for v in estimate)
        and math.isfinite(estimate[0])
        and estimate[0] > 0
    ):
        # At high accumulation, the step time estimated from its micro-steps (see step_estimate).
        mean, std, ci = estimate
        std = std if math.isfinite(std) else mean
        df = rank0.get("estimate_df")
        df = float(df) if isinstance(df, (int, float)) and not isinstance(df, bool) and df >= 1 else None
        stable = estimate_is_stable(
            (mean, std, ci), whole_steps=len(intervals), min_steps=min(2, min_steps), rel_ci=rel_ci
        )
        left_out = _left_out_micro_steps(rank0)
    result.measurement = Measurement(
        samples_per_step=int(rank0["samples_per_step"]),
        step_time_mean=mean,
        step_time_std=std,
        step_time_ci95=ci if math.isfinite(ci) else mean,
        steps_measured=len(intervals),
        step_time_df=df if math.isfinite(ci) and df and df >= 1 else None,
        stable=stable,
        tokens_per_sample=rank0.get("tokens_per_sample"),
        flops_per_step=rank0.get("flops_per_step"),
        flops_note=rank0.get("flops_note") or "",
        early_stop=bool(rank0.get("early_stop")),
        tied=bool(rank0.get("tied")) and not rank0.get("early_stop"),
        **_lost_to(rank0),
        **left_out,
        timed_seconds=float(sum(intervals)),
    )
    if budget and result.max_peak and result.max_peak > budget:
        result.state = TrialState.OOM
        result.reason = f"peak memory {format_size(result.max_peak)} above the budget of {format_size(budget)}"
        return result
    result.state = TrialState.OK
    result.reason = "; ".join(reasons + [r["note"] for r in present[:1] if r.get("note")])
    return result


def _left_out_micro_steps(rank0: dict) -> dict[str, Any]:
    """The micro-steps the probe left out of its estimate as disturbances, as Measurement fields
    (none where the report's are not plain durations)."""
    out, median = rank0.get("left_out"), rank0.get("left_out_median")
    if not (isinstance(out, list) and out and all(_positive(v) for v in out) and _positive(median)):
        return {"left_out": [], "left_out_median": None}
    return {"left_out": [float(v) for v in out], "left_out_median": float(median), "left_out_unit": "micro-step"}


def _positive(v: Any) -> bool:
    """A positive, finite number (not a bool), as a rank's report should hold."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _lost_to(rank0: dict) -> dict[str, Any]:
    """The best trial's figure an early-stopped trial lost to, as Measurement fields."""
    lost = rank0.get("lost_to")
    if not rank0.get("early_stop") or not isinstance(lost, dict):
        return {}
    value, metric = lost.get("value"), lost.get("metric")
    if not _positive(value) or metric not in ("throughput", "latency"):
        return {}
    return {"lost_to": float(value), "lost_to_metric": metric}


def mean_losses(ranks: list[dict]) -> list[float]:
    """The first steps' mean losses over the ranks (each rank's own mean per step): the steps every
    rank reported, none where one reported something other than finite numbers."""
    lists = [r.get("losses") or [] for r in ranks]
    if not lists or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for lst in lists for v in lst
    ):
        return []
    steps = min(len(lst) for lst in lists)
    return [sum(lst[k] for lst in lists) / len(lists) for k in range(steps)]
