"""Results on disk. Every file is written atomically, so a kill at any moment leaves either the
old file or the new one; a trial counts as finished only once its result.json exists."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import ZerotuneError
from .._files import make_folder, write_json
from ..trials import TrialResult

RESULT = "result.json"
SESSION = "tuning.json"


class ResultStore:
    """``root/<trial name>/`` per trial, plus the session's files at ``root``. ``made``: the
    trial folders zerotune made in ``root`` (its record's list); only those are read as trials,
    and each new one is added (``on_made`` is told, to record it before the trial runs)."""

    def __init__(
        self,
        root: Path,
        *,
        create: bool = True,
        made: set[str] | None = None,
        on_made: Callable[[str], None] | None = None,
    ):
        """``create`` False: only read an existing folder (show, report)."""
        self.root = Path(root)
        self.made = set(made or ())
        self.on_made = on_made or (lambda name: None)
        if create:
            make_folder(self.root)

    def trial_dir(self, name: str) -> Path:
        """The folder of trial ``name``, a real folder directly inside the results folder: never
        a link followed out of it (a link in its place is removed, the link alone)."""
        assert name and "/" not in name and not name.startswith("."), f"unsafe trial name {name!r}"
        d = self.root / name
        if name not in self.made:
            self.made.add(name)
            self.on_made(name)
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            d.unlink()
        d.mkdir(exist_ok=True)
        return d

    def load_raw(self, name: str) -> dict[str, Any] | None:
        """The stored result.json of trial ``name`` (a JSON object), or None: none, or damaged."""
        path = self.root / name / RESULT
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def load(self, name: str) -> TrialResult:
        """The result of trial ``name``; a :class:`DamagedTrial` error that says why when the
        file is missing or damaged."""
        data = self.load_raw(name)
        if data is None:
            missing = not (self.root / name / RESULT).is_file()
            raise DamagedTrial(
                name, "its result.json is missing" if missing else "its result.json is damaged (not a JSON object)"
            )
        try:
            return TrialResult.from_dict(data["result"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # A ValueError says what is wrong in words (TrialResult.from_dict's); the rest, its kind.
            why = str(e)[:160] if isinstance(e, ValueError) and str(e) else type(e).__name__
            raise DamagedTrial(name, f"its result.json is damaged ({why})") from None

    def stored(self) -> dict[str, dict[str, Any]]:
        """Every trial folder's result.json, readable or not ({}), by folder name: the folders
        zerotune made here, never another folder that happens to hold a result.json."""
        out: dict[str, Any] = {}
        for name in sorted(self.made):
            path = self.root / name
            if path.is_symlink() or not (path / RESULT).is_file():
                continue
            out[name] = self.load_raw(name) or {}
        return out

    def save(self, result: TrialResult, meta: dict[str, Any]) -> None:
        """Write the trial's result.json with ``meta`` (its key and identity) beside the result."""
        d = self.trial_dir(result.name)
        if result.measurement is not None or result.peak_memory:
            write_json(d / "metrics.json", result.to_dict())
        write_json(d / RESULT, {**meta, "result": result.to_dict()})


class DamagedTrial(ZerotuneError):
    def __init__(self, name: str, why: str):
        super().__init__(f"trial {name}: {why}; rerun the tuning command to measure it again")
        self.name, self.why = name, why
