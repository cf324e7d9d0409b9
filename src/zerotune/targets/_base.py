"""What is tuned: a DeepSpeed script (or a function run through zerotune's entry script) or a
Lightning program. The core asks a :class:`Target` how a trial runs it, what config and command
it trains with afterwards, and what of it identifies a trial for resume; it has no branch of
its own for any kind.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ._command import UserCommand

if TYPE_CHECKING:
    from ..launch import Cluster, ProgramLauncher
    from ..request import FsdpSettings
    from ..trials import TrialSpec
    from ._fsdp_forms import FsdpForm


class Target(abc.ABC):
    """What is tuned, as the core sees it: a program that trials run and that then trains.

    A subclass says how a trial runs the program and what it trains with afterwards; the core
    never branches on the kind. Call order, once per tuning: :meth:`config_source` and
    :meth:`processes` (before the cluster is built), :meth:`check_cluster`, :meth:`arg_mappings`
    and :meth:`script_batch` (the batch options), :meth:`own_spec` and :meth:`identity`; then,
    per trial, :meth:`trial_args`, :meth:`probe_fields` and :meth:`program_launcher`; once a
    configuration is chosen, :meth:`final_config`, :meth:`final_command` and :meth:`after_tuning`
    (the files it writes named by :meth:`output_files`). Only :meth:`trial_args` and
    :meth:`final_command` must be written; every other hook has a default that suits a plain
    DeepSpeed script. Kinds are found by :func:`zerotune.targets.detect`.
    """

    command: UserCommand
    kind = "the script"
    """What the target is, in the summary's words."""

    @property
    def script(self) -> str:
        return self.command.script

    def config_source(self, given: str | Path | dict[str, Any] | None) -> str | Path | dict[str, Any] | None:
        """The ds_config to tune from: the one given, else the one the target brings or names."""
        return given if given is not None else self.command.config_path()

    def processes(self, num_gpus: int | None) -> int | None:
        """Processes per node, checked against what the target itself asks for."""
        return num_gpus

    @property
    def num_params(self) -> int | None:
        """The model's parameter count when known before any trial."""
        return None

    @abc.abstractmethod
    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        """The script's arguments for a run with the ds_config at ``config`` (``mapped``: the
        arg_mappings options with their values)."""

    def arg_mappings(self, config: dict[str, Any], given: dict[str, str] | None) -> dict[str, str]:
        """Which script options carry the micro-batch and the accumulation (``arg_mappings``):
        the user's, or the ones the target knows its program reads."""
        return dict(given or {})

    def script_batch(self, mappings: dict[str, str]) -> dict[str, int]:
        """The batch values the command gives the mapped options now (``{ds_config key: value}``),
        the global batch to hold where the ds_config leaves it to the script."""
        out = {}
        for key, flag in mappings.items():
            value = self.command.option_value(flag)
            if value is not None and value.strip().isdigit() and int(value) >= 1:
                out[key] = int(value)
        return out

    def check_cluster(self, cluster: Cluster) -> None:
        """Raise a ConfigError where the target cannot run on ``cluster``."""

    def program_launcher(self, root: Path, ds_config: Path, num_gpus: int) -> ProgramLauncher | None:
        """The program's own launcher for a run with ``ds_config`` (files it needs go in the
        results folder ``root``); None: DeepSpeed's per-node launcher starts the ranks."""
        return None

    def probe_fields(self, config: Path) -> dict[str, Any]:
        """What the probe in each rank needs beyond the arguments to give the run its config."""
        return {}

    def final_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """A trial's config in the form the program accepts for training."""
        return config

    @abc.abstractmethod
    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster: Cluster) -> str:
        """The shell text (every word quoted) that trains with ``config``, written at ``optimal``,
        on the tuned topology."""

    def own_spec(self, request, dp: int) -> TrialSpec | None:
        """The trial that runs the user's own configuration as it stands (see request._own; the
        script's mapped batch options resolve an "auto" micro-batch), measured first and compared
        with the choice; None where the config leaves the stage or the micro-batch to a search."""
        return request.own

    def output_files(self) -> tuple[str, ...]:
        """Files the target writes at the results folder's top besides every tuning's outputs
        (in :meth:`final_command` or :meth:`after_tuning`): recorded in tuning.json, removed by
        ``--overwrite`` and as a tuning starts."""
        return ()

    def after_tuning(self, result) -> None:
        """Record the result where the program looks for it (Lightning's cache)."""

    def identity(self) -> tuple[str, list[str]]:
        """What of the target a trial's measurement depends on besides its ds_config: a hash of
        its code, and its kind with its arguments."""
        return self.command.code_identity(), [type(self).__name__, *self.command.identity_args()]

    @property
    def engine(self) -> str:
        """The engine the program is configured for: what is tuned unless ``engines`` says more."""
        return "deepspeed"

    @property
    def fsdp(self) -> FsdpForm | None:
        """How an FSDP2 trial of this program runs, and the command that trains with FSDP2 (the
        same methods as this class's, for the other engine); None: the program trains with
        DeepSpeed only (its engine is chosen in its code)."""
        return None

    def fsdp_settings(self, ds_config: dict[str, Any], wrap: tuple[str, ...] = ()) -> FsdpSettings:
        """What an FSDP2 trial keeps of the user's setup: the mixed precision the program trains
        in with DeepSpeed (``ds_config``'s), and the blocks to wrap (``wrap``: the user's)."""
        from ..request import FsdpSettings, precision_of

        return FsdpSettings(wrap=wrap, mixed_precision=precision_of(ds_config))


@dataclass
class ScriptTarget(Target):
    """A DeepSpeed script that reads ``--deepspeed_config`` (or ``--deepspeed``)."""

    command: UserCommand

    def trial_args(self, config: Path, mapped: dict[str, str]) -> list[str]:
        return self.command.trial_args(str(config.resolve()), mapped)

    def final_command(self, optimal: Path, config: dict[str, Any], mapped: dict[str, str], cluster: Cluster) -> str:
        return cluster.command_line(self.script, self.trial_args(optimal, mapped)) + "\n"


def require_config(source: Any) -> Any:
    if source is None:
        raise ConfigError("no ds_config given; add --deepspeed_config ds.json to the script's arguments")
    return source
