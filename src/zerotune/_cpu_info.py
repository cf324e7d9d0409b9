"""DeepSpeed's question about the CPU, asked once per host and tuning instead of at every op load.

Each time DeepSpeed loads one of its ops (FusedAdam on CPU, the CPU Adam of offload, any JIT op's
compiler flags) it asks py-cpuinfo for the CPU's architecture and SIMD flags, twice per op, and
each answer starts a Python subprocess: about 1.1 s on a 2-core machine, 2.2 s of every cold
trial's start-up before its first step. The answer is a property of the host, so the tuner asks
once while the launcher starts (:func:`prefetch`, on the core the launcher leaves idle) and every
rank on the same host reads that answer (:func:`install`); a rank on another host, or one that
starts before the answer is written, asks once itself and keeps what it got.

The answer lives in the results folder for one tuning only: :func:`prefetch` removes the last
tuning's before asking, so a folder moved to another machine never answers for it.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.util
import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "ZEROTUNE_CPU_INFO"
"""The path of the answer file, set for the ranks by the launcher."""
FILE = "_cpu_info.json"
"""Its name in the results folder."""


def _ask() -> dict[str, Any] | None:
    try:
        import cpuinfo
    except ImportError:
        return None
    return cpuinfo.get_cpu_info()


def prefetch(path: Path, ask: Callable[[], dict[str, Any] | None] | None = None) -> threading.Thread:
    """Ask (py-cpuinfo, or ``ask``) in a background thread (the question waits on a subprocess, so
    the thread holds no core) and write ``{"host", "info"}`` to ``path``; the thread, to join
    before the tuning ends."""
    from ._files import write_atomic

    ask = ask or _ask

    try:
        path.unlink()  # the last tuning's answer: never read for this one (a link goes, not its target)
    except OSError:
        pass  # none; or a folder in its place, where the write below fails too and the ranks ask themselves

    def run() -> None:
        try:
            info = ask()
            if info:
                write_atomic(path, json.dumps({"host": socket.gethostname(), "info": info}))
        except Exception:  # noqa: BLE001 - an optimisation only: the ranks then ask themselves
            pass

    thread = threading.Thread(target=run, name="zerotune-cpu-info", daemon=True)
    thread.start()
    return thread


def read(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """The answer stored at ``path`` for this host, or None (none, damaged, another host's)."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("host") != socket.gethostname() or not isinstance(data.get("info"), dict):
        return None
    return data["info"]


def install(path: str | os.PathLike | None) -> None:
    """In a rank: py-cpuinfo's ``get_cpu_info`` answers from ``path`` (or from its own first
    answer), for the life of the process. DeepSpeed imports the function where it calls it, so
    replacing the module's attribute reaches it. py-cpuinfo is not imported here but patched as
    whoever needs it imports it: imported early, its ``multiprocessing`` changes the order in which
    the interpreter's exit finalizes the script's objects (a failed script's unclosed log file
    was then never flushed)."""
    module = sys.modules.get("cpuinfo")
    if module is not None:
        _patch(module, path)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(path))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first import of py-cpuinfo, has the other finders find it
    and patches the module once it has run."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = path

    def find_spec(self, name, path=None, target=None):
        if name != "cpuinfo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Wrapped(spec.loader, self.path)
        return spec


class _Wrapped(importlib.abc.Loader):
    """py-cpuinfo's own loader, then the patch."""

    def __init__(self, loader, path):
        self.loader, self.path = loader, path

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch(module, self.path)

    def __getattr__(self, name):  # what else asks the loader (is_package, get_resource_reader)
        return getattr(self.loader, name)


def _patch(module, path) -> None:
    original = getattr(module, "get_cpu_info", None)
    if not callable(original) or getattr(original, "zerotune_cached", False):
        return  # another py-cpuinfo than the one DeepSpeed calls: left as it is
    known: list[dict[str, Any]] = []
    lock = threading.Lock()

    def get_cpu_info() -> dict[str, Any]:
        with lock:
            if not known:
                known.append(read(path) or original())
        return copy.deepcopy(known[0])  # callers may change what they get

    get_cpu_info.zerotune_cached = True  # type: ignore[attr-defined]
    get_cpu_info.__doc__ = original.__doc__
    module.get_cpu_info = get_cpu_info
