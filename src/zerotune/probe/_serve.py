"""A warm rank process: one launch serves many trials. The tuner writes ``order<N>.json`` in the
pool folder (the trial's probe.json, or an order to exit); every rank runs that trial in a
sandbox, tears it down, checks that nothing leaked, and writes ``done<N>.rank<R>.json``. A rank
whose trial did not end cleanly, or whose checks failed, exits instead of waiting for the next
order: the tuner sees that in its done file and retires the whole group. Ranks never agree over
a collective between trials; the tuner, reading every rank's done file, is the arbiter.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from .._files import write_json
from ._history import ProcessHistory
from ._memory import current_rss, device_in_use, reset_peak
from ._sandbox import TrialSandbox, clear_deepspeed_caches, clear_library_state
from ._trial import redirect, run_measured

ORDER_POLL = 0.02
CHILD_GRACE = 10.0
"""Seconds a trial's child processes (DataLoader workers) get to end once the trial is gone."""
GPU_SLACK = 1 << 20
"""Device memory above the baseline that still counts as back at it (allocator rounding)."""


def process_counts() -> dict[str, int]:
    """Threads, open file descriptors and live child processes of this process."""
    me = str(os.getpid())
    children = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            children += len(fields) > 1 and fields[1] == me and fields[0] != "Z"
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "children": children,
    }


class LeakCheck:
    """Counts after teardown against the baseline. The first trial of each kind (a stage, an
    offload) may grow them once (a gloo group clone, DeepSpeed's ops, lazy imports); a later
    trial of a kind already run must leave them where they were."""

    def __init__(self) -> None:
        self.baseline: dict[str, int] = {}
        self.kinds: set[str] = set()
        self.device_baseline: dict[str, int] = {}

    def check_device(self, kind: str, used: int | None) -> str:
        """Device memory held by tensors after teardown, against its level after the first trial
        of this kind (None on CPU: nothing to check)."""
        if used is None:
            return ""
        base = self.device_baseline.setdefault(kind, used)
        if used > base + GPU_SLACK:
            return f"device memory in use grew from {base} to {used} bytes after teardown ({kind})"
        return ""

    def check(self, kind: str, counts: dict[str, int]) -> str:
        grown = {k: (self.baseline[k], v) for k, v in counts.items() if k in self.baseline and v > self.baseline[k]}
        first = kind not in self.kinds
        self.kinds.add(kind)
        if counts.get("children"):
            return f"the script left {counts['children']} child process(es) running (DataLoader workers?)"
        if grown and not first:
            return (
                "; ".join(f"{k} grew from {a} to {b}" for k, (a, b) in grown.items())
                + f" after a trial of a kind already run ({kind})"
            )
        for k, v in counts.items():
            self.baseline[k] = max(v, self.baseline.get(k, v))
        return ""


def teardown(probe, sandbox: TrialSandbox) -> tuple[str, dict[str, Any]]:
    """The engine destroyed, the process put back, the engine proved gone. Returns why the
    process must retire ("" when clean) and what was found."""
    alive = [weakref.ref(e) for e in probe.engines]
    for ref in alive:
        _destroy(ref())
    probe.engine = probe.memory = None
    restored = sandbox.exit()
    cleared = clear_deepspeed_caches() + clear_library_state()
    # Collections until the engine is gone or one frees nothing. Each full collection of a process
    # holding torch and DeepSpeed takes about 0.2 s on CPU; the one after the engine is gone freed
    # nothing in every trial we timed, so it is not made.
    for _ in range(3):
        if gc.collect() == 0 or all(ref() is None for ref in alive):
            break
    info: dict[str, Any] = {
        "restored": restored,
        "cleared": cleared,
        "atexit_hooks": len(sandbox.atexit_hooks),
        "destroyed_group": sandbox.destroyed_group,
    }
    if any(ref() is not None for ref in alive):
        print(
            "zerotune: still alive after teardown, held from: " + holders(next(r() for r in alive if r())),
            file=sys.stderr,
        )
        return "a DeepSpeed engine of the trial is still alive after teardown", info
    import torch.distributed as dist

    if not dist.is_initialized():
        return "the process group is gone after the trial", info
    return "", info


def _destroy(engine: Any) -> None:
    """``engine.destroy()`` (needed for ZeRO-3), in a frame of its own so that no local of the
    caller keeps the engine."""
    if engine is not None and hasattr(engine, "destroy"):
        try:
            engine.destroy()
        except Exception as e:  # noqa: BLE001 -- a failed destroy shows as a leak below
            print(f"zerotune: engine.destroy() failed: {e!r}", file=sys.stderr)


def holders(obj: Any, limit: int = 200) -> str:
    """The chain of references from a module's globals (or a class) down to ``obj``, found
    breadth-first up the referrers: why an engine outlived its trial."""
    roots = {id(vars(m)): name for name, m in list(sys.modules.items()) if m is not None and hasattr(m, "__dict__")}
    parent: dict[int, tuple[Any, int | None]] = {id(obj): (obj, None)}
    frontier, seen = [obj], 0
    while frontier and seen < limit:
        item = frontier.pop(0)
        for ref in gc.get_referrers(item):
            if id(ref) in parent or type(ref).__name__ == "frame" or ref is frontier:
                continue
            parent[id(ref)] = (ref, id(item))
            seen += 1
            if id(ref) in roots or isinstance(ref, type):
                chain, at = [], id(ref)
                while at is not None:
                    o, at = parent[at]
                    chain.append(
                        roots.get(id(o))
                        or type(o).__name__
                        + (
                            f" {getattr(o, '__qualname__', '')}"
                            if callable(o)
                            else f" keys {','.join(map(str, list(o)[:6]))}"
                            if isinstance(o, dict)
                            else ""
                        )
                    )
                return " -> ".join(c[:120] for c in chain)
            frontier.append(ref)
    return f"no module or class found within {seen} referrers (a cycle that gc should free)"


def wait_children(deadline: float) -> dict[str, int]:
    counts = process_counts()
    while counts["children"] and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
        counts = process_counts()
    return counts


def serve(pool: Path, rank: int, local_rank: int) -> None:
    """Run trials as ordered until told to exit, or until one does not end cleanly."""
    import torch

    redirect(pool, f"rank{rank}")
    leaks, seq, history = LeakCheck(), 0, ProcessHistory()
    while True:
        order = _next_order(pool / f"order{seq}.json")
        if order.get("exit"):
            os._exit(0)
        started = time.monotonic()
        spec = json.loads(Path(order["probe"]).read_text())
        resettable = reset_peak(torch)
        if spec.get("lightning_config"):
            # Imported before the snapshot, so that the probe's Lightning hooks are put back too.
            import importlib

            importlib.import_module("lightning.pytorch.strategies")
        sandbox = TrialSandbox(spec["script"])
        sandbox.enter()
        os.environ["ZEROTUNE_PROBE"] = order["probe"]  # as a cold trial's ranks see it (restored after)
        probe, why = run_measured(spec, rank, local_rank, warm=True, history=history)
        ended = time.monotonic()
        sys.stdout.flush()
        sys.stderr.flush()
        probe_failed = probe.finished is None or probe.finished[1] != 0
        teardown_why, info = teardown(probe, sandbox)
        del probe
        why = why or teardown_why
        counts = wait_children(time.monotonic() + CHILD_GRACE)
        kind = str(order.get("kind", ""))
        why = why or leaks.check(kind, counts)
        used = device_in_use(torch)
        why = why or leaks.check_device(kind, used)
        if not why and not resettable:
            why = "the peak memory reading cannot be reset in this process (/proc/self/clear_refs)"
        redirect(pool, f"rank{rank}")
        write_json(
            pool / f"done{seq}.rank{rank}.json",
            {
                "clean": not why,
                "why": why,
                "trial_s": ended - started,
                "teardown_s": time.monotonic() - ended,
                "rss": current_rss(),
                "device_in_use": used,
                **counts,
                **info,
            },
        )
        if why:
            # A failed trial exits non-zero, so that DeepSpeed's launcher ends ranks left waiting
            # in a collective at once; a leak alone retires the process quietly.
            os._exit(1 if probe_failed else 0)
        seq += 1


def _next_order(path: Path) -> dict[str, Any]:
    while True:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            time.sleep(ORDER_POLL)
        except ValueError:
            time.sleep(ORDER_POLL)  # written atomically, so only a damaged file lands here
