"""Results on disk. Every file is written atomically, so a kill at any moment leaves either the
old file or the new one; a trial counts as finished only once its result.json exists."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ._errors import ZerotuneError
from .trial import TrialResult

RESULT = "result.json"
SESSION = "tuning.json"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ZerotuneError(f"cannot write {path}: {e.strerror}; free some space or choose another "
                            "--results-dir (finished trials are kept)") from None


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def fingerprint(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class ResultStore:
    """``root/<trial name>/`` per trial, plus the session's files at ``root``."""

    def __init__(self, root: Path, *, overwrite: bool = False):
        self.root = Path(root)
        if overwrite and self.root.exists():
            for child in self.root.iterdir():
                if (child / RESULT).exists() or (child / "probe.json").exists():
                    shutil.rmtree(child)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ZerotuneError(f"cannot create the results folder {self.root}: {e.strerror}") from None

    def trial_dir(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def load(self, name: str, key: str) -> TrialResult | None:
        """The stored result of trial ``name`` if it was run with the same inputs (``key``)."""
        path = self.root / name / RESULT
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if data.get("key") != key:
            return None
        return TrialResult.from_dict(data["result"])

    def save(self, result: TrialResult, key: str) -> None:
        d = self.trial_dir(result.name)
        if result.measurement is not None or result.peak_memory:
            write_json(d / "metrics.json", result.to_dict())
        write_json(d / RESULT, {"key": key, "result": result.to_dict()})

    def all_results(self) -> list[TrialResult]:
        out = []
        for path in sorted(self.root.glob(f"*/{RESULT}"), key=lambda p: p.stat().st_mtime):
            try:
                out.append(TrialResult.from_dict(json.loads(path.read_text())["result"]))
            except (OSError, ValueError, KeyError):
                continue
        return out
