"""The results folder must be on storage every node sees: each rank writes its result there.

Before any trial, every node of the pool writes a marker (a fresh token) into the results folder
and this process reads it back. A node whose marker does not arrive leaves the pool with the
reason; one the training runs on is an error that names the fix.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .._errors import LaunchError
from ._hosts import Host

MARKER_PREFIX = ".zerotune-shared-"
MARKER_TIMEOUT = 120.0
"""Seconds every node's marker write may take (a job step or an ssh connection each)."""


def marker_path(results_dir: Path, host: Host) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host.name)
    return results_dir / f"{MARKER_PREFIX}{safe}"


def check_shared(
    results_dir: Path,
    pool: list[Host],
    training: list[Host],
    marker_argv: Callable[[Host, Path, str], list[str]],
) -> dict[str, str]:
    """Each host of ``pool`` writes a marker through ``marker_argv(host, path, token)`` (all at
    once); the hosts whose marker this process cannot read back, and why. Raises when one of
    ``training`` fails."""
    results_dir = results_dir.resolve()
    token = secrets.token_hex(8)
    started: list[tuple[Host, Path, subprocess.Popen | None, str]] = []
    for host in pool:
        path = marker_path(results_dir, host)
        path.unlink(missing_ok=True)
        try:
            proc = subprocess.Popen(
                marker_argv(host, path, token),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            started.append((host, path, proc, ""))
        except OSError as e:
            started.append((host, path, None, e.strerror or str(e)))
    deadline = time.monotonic() + MARKER_TIMEOUT
    failed: dict[str, str] = {}
    for host, path, proc, why in started:
        if proc is not None:
            try:
                _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                why = "" if proc.returncode == 0 else " ".join(err.split())[:200] or f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                why = f"its marker write did not end within {MARKER_TIMEOUT:.0f} s"
        try:
            seen = path.read_text() == token
        except OSError:
            seen = False
        path.unlink(missing_ok=True)
        if not seen:
            failed[host.name] = (
                f"its marker in the results folder was not seen here ({why})"
                if why
                else "it wrote its marker into the results folder, but not where this node reads it: "
                "the folder is not on storage both see"
            )
    for host in training:
        if host.name in failed:
            raise LaunchError(
                f"host {host.name!r}, which the training runs on, cannot write into the results folder "
                f"{str(results_dir)!r}: {failed[host.name]}; give --results-dir a folder on a file system "
                "every node mounts at the same path"
            )
    return failed
