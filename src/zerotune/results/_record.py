"""The record of one tuning: which trials belong to it, under what identity a stored trial may be
reused, and the events the caller sees.

A results folder can hold trials of earlier tunings (another space, an edited script). Only the
trials this record lists (``tuning.json``'s ``trials``, in order) are this tuning's; every reader
(``zerotune show``, ``report``, :func:`~zerotune.load_results`, the Lightning cache) uses
that list. A stored trial is reused only when everything it measured is the same: the user's
code, arguments, the trial's ds_config, the topology and the measurement settings. A trial that
failed is retried when the settings that failed it (timeouts, memory budget) changed, and always
with ``retry_failed``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from .._errors import ZerotuneError
from .._files import fingerprint, write_json
from ..trials import TrialResult, TrialSpec, TrialState
from ._folder import MARK, made, outputs
from ._store import SESSION, ResultStore

if TYPE_CHECKING:
    from ..trials import Choice

IDENTITY_PARTS = {
    "code": "the script changed",
    "args": "the script's arguments changed",
    "config": "its ds_config changed",
    "topology": "the processes, nodes or devices changed",
    "measure": "the measurement settings changed",
    "env": "the environment the trials run with changed (threads, accelerator, allocator)",
}
"""Parts of a trial's identity, and what a rerun says when one differs."""
FAILED = (TrialState.CRASHED, TrialState.TIMEOUT, TrialState.OOM)


@dataclass(frozen=True)
class TuningEvent:
    """Progress for the caller: kind is one of started, finished, reused, pruned, best, note,
    confirm (a re-measurement of a configuration within noise of the best; ``index`` its round)."""

    kind: str
    index: int = 0
    max_trials: int = 0
    spec: TrialSpec | None = None
    result: TrialResult | None = None
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class Identity:
    """What every trial of this tuning shares; a trial adds its own ds_config."""

    code: str
    args: list[str]
    topology: dict[str, Any]
    measure: dict[str, Any]
    env: dict[str, str]
    """What the trials' environment sets that their figures depend on (Cluster.run_env)."""
    failure: dict[str, Any]
    """Settings under which a trial can fail without its configuration being at fault."""

    def of(self, config: dict[str, Any]) -> dict[str, str]:
        return {
            "code": self.code,
            "args": fingerprint(self.args),
            "config": fingerprint(config),
            "topology": fingerprint(self.topology),
            "measure": fingerprint(self.measure),
            "env": fingerprint(self.env),
        }


class TuningRecord:
    """The store, this tuning's trials and its events. Built fresh by each ``tune()``."""

    def __init__(
        self,
        root: Path,
        *,
        identity: Identity,
        session: dict[str, Any],
        previous: dict[str, Any] | None = None,
        retry_failed: bool = False,
        max_trials: int = 0,
        on_event: Callable[[TuningEvent], None] | None = None,
    ):
        """``previous``: the folder's record before this tuning (the trial folders it made stay
        this folder's, see results_folder)."""
        self.store = ResultStore(root, made=made(previous), on_made=lambda name: self.write_session(self._state))
        self.previous_outputs = outputs(previous)
        self.root = self.store.root
        self._state = "running"
        self.identity, self.session, self.retry_failed = identity, dict(session), retry_failed
        self.max_trials = max_trials
        self.on_event = on_event or (lambda e: None)
        self.trials: list[TrialResult] = []
        self.notes: list[str] = []
        self.launched = 0
        self.earlier_time = 0.0
        """What the trials and re-measurements this tuning reused from disk took in the earlier
        runs that measured them (see reused)."""
        self.last_run: TrialResult | None = None
        """The trial this tuning launched that finished last (what ran just before the next)."""
        self.best_name: str | None = None
        """The trial leading so far (see :meth:`lead`)."""
        self.unranked: dict[str, str] = {}
        """Engines whose trials are not ranked against the others, and why (they train other
        numbers: see zerotune.tuning's engine comparison)."""

    @property
    def ranked(self) -> list[TrialResult]:
        """The trials the choice is made among: those of an engine that is not :attr:`unranked`."""
        return [t for t in self.trials if t.spec.engine not in self.unranked]

    # -- events --------------------------------------------------------------------------------
    def emit(
        self,
        kind: str,
        index: int = 0,
        spec: TrialSpec | None = None,
        result: TrialResult | None = None,
        message: str = "",
    ) -> None:
        self.on_event(TuningEvent(kind, index, self.max_trials, spec, result, message))

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.emit("note", message=message)

    # -- reuse ---------------------------------------------------------------------------------
    def why_not_reused(self, stored: dict[str, Any], config: dict[str, Any]) -> str | None:
        """None when the stored trial can stand for one run now with ``config``; else why not."""
        ident = stored.get("identity")
        if not isinstance(ident, dict):
            return "it was stored by an older zerotune"
        try:
            result = TrialResult.from_dict(stored.get("result"))
        except (TypeError, ValueError):
            return "its result is damaged"
        now = self.identity.of(config)
        for part, why in IDENTITY_PARTS.items():
            if ident.get(part) != now[part]:
                return why
        budget = self.identity.failure.get("budget")
        if result.state is TrialState.OK and budget and (result.max_peak or 0) > budget:
            return "its peak memory is above the memory budget now"
        if result.state is TrialState.KILLED:
            return "it was killed from outside zerotune"
        if result.state in FAILED:
            if self.retry_failed:
                return "--retry-failed"
            if stored.get("failure") != self.identity.failure:
                return "it failed under other timeouts or memory budget"
        return None

    def lookup(self, spec: TrialSpec, config: dict[str, Any]) -> TrialResult | None:
        """The stored result of ``spec`` if it may be reused, else None."""
        stored = self.store.load_raw(spec.name)
        if stored is None or self.why_not_reused(stored, config) is not None:
            return None
        result = TrialResult.from_dict(stored["result"])
        return result if result.spec == spec else None

    def key(self, config: dict[str, Any]) -> str:
        return fingerprint(self.identity.of(config))

    def resume_line(self, config_of: Callable[[TrialSpec], dict[str, Any]]) -> str | None:
        """One line on the trials an earlier tuning left here: how many can be reused, and why
        the others will run again. ``config_of`` gives the ds_config a spec runs with now."""
        # Pruned trials are decided afresh by every tuning, never reused: not counted.
        stored = {
            name: data
            for name, data in self.store.stored().items()
            if (data.get("result") or {}).get("state") != TrialState.PRUNED.value
        }
        if not stored:
            return None
        reusable, why = 0, Counter()
        for data in stored.values():
            try:
                spec = TrialSpec.from_dict(data["result"]["spec"])
            except (KeyError, TypeError, ValueError):
                reason = "its result is damaged"
            else:
                reason = self.why_not_reused(data, config_of(spec))
            if reason is None:
                reusable += 1
            else:
                why[reason] += 1
        line = f"{len(stored)} trial(s) on disk in {self.root}: {reusable} reusable"
        if why:
            line += "; run again: " + ", ".join(f"{n} because {r}" for r, n in why.most_common())
        return line

    def reused(self, result: TrialResult) -> None:
        """Count a trial or re-measurement taken from disk instead of run: its time was spent by
        the run that measured it, and is part of what this tuning cost."""
        self.earlier_time += result.wall_time

    # -- recording -----------------------------------------------------------------------------
    def launching(self) -> None:
        """Count a trial this tuning launches (not reused, not pruned)."""
        self.launched += 1

    def ran(self, result: TrialResult) -> None:
        """A trial this tuning launched has finished: what ran just before the next."""
        self.last_run = result

    def lead(self, choice: Choice | None) -> None:
        """The choice among the trials so far (a :class:`~zerotune.trials.Choice`, or None):
        a new leader is told as a "best" event."""
        if choice is not None and choice.best.name != self.best_name:
            self.best_name = choice.best.name
            self.emit("best", len(self.trials), choice.best.spec, choice.best)

    def add(self, result: TrialResult) -> None:
        """Append a trial to this tuning. A measured one is already on disk (:meth:`save`); a
        pruned one is written here, marked never to be reused (it is decided afresh each time)."""
        self.trials.append(result)
        if result.state is TrialState.PRUNED:
            self.store.save(result, {"key": "pruned"})
        self.write_session("running")

    def save(self, result: TrialResult, config: dict[str, Any]) -> None:
        self.store.save(
            result, {"key": self.key(config), "identity": self.identity.of(config), "failure": self.identity.failure}
        )

    def write_session(
        self,
        state: str,
        *,
        wall: float = 0.0,
        notes: list[str] | None = None,
        best: str | None = None,
        best_config: dict[str, Any] | None = None,
        remeasured: list[dict[str, Any]] | None = None,
        confirm_from_trial: str | None = None,
    ) -> None:
        """``remeasured``: the re-measurements that confirmed the choice ``best``;
        ``confirm_from_trial``: the candidate whose trial stood as its first-round figure."""
        self._state = state
        write_json(
            self.root / SESSION,
            {
                MARK: __version__,
                **self.session,
                "state": state,
                "pid": os.getpid(),
                "made": sorted(self.store.made),
                "wall_time": wall,
                "earlier_time": self.earlier_time,
                "trials": [t.name for t in self.trials],
                "notes": list(notes or self.notes),
                "best": best,
                "best_config": best_config,
                "remeasured": remeasured or [],
                "confirm_from_trial": confirm_from_trial,
            },
        )

    def clear_outputs(self) -> None:
        """Remove an earlier tuning's outputs as this one starts (they are written again when it
        ends), so that no stale ds_config_optimal.json or cmd_optimal.txt stands beside the record
        of an interrupted tuning, or beside a summary saying 'best: none'."""
        for name in dict.fromkeys(self.previous_outputs + outputs(self.session)):
            path = self.root / name
            if path.is_symlink() or path.is_file():
                path.unlink()


def read_session(root: Path) -> dict[str, Any]:
    """``tuning.json`` of a results folder, or a ZerotuneError that says what is wrong with it."""
    path = Path(root) / SESSION
    if not path.is_file():
        raise ZerotuneError(
            f"{root} holds no zerotune results ({SESSION} is missing); give the results_dir of a tuning run"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ZerotuneError(
            f"{path} is damaged ({type(e).__name__}); rerun the tuning command to rebuild it "
            "(finished trials are reused)"
        ) from None
    if not isinstance(data, dict):
        raise ZerotuneError(
            f"{path} is damaged (not a JSON object); rerun the tuning command to rebuild it "
            "(finished trials are reused)"
        )
    return data
