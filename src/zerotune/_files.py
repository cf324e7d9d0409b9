"""Files written atomically: a kill at any moment leaves either the old file or the new one."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ._errors import ZerotuneError


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8", errors="surrogateescape")
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder: the error to report is the write's, below
        raise ZerotuneError(
            f"cannot write {path}: {e.strerror}; make the folder writable, free some space or "
            "choose another --results-dir (finished trials are kept)"
        ) from None


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def fingerprint(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def make_folder(root: Path) -> None:
    """Create the results folder (and its parents) where it is missing."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ZerotuneError(
            f"cannot create the results folder {root}: {e.strerror}; choose another --results-dir"
        ) from None
