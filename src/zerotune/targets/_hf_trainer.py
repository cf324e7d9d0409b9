"""A Hugging Face ``Trainer`` script as a tuning target (``run_clm.py`` style: ``HfArgumentParser``,
``TrainingArguments(deepspeed=...)``, ``"auto"`` values in the ds_config).

Such a script fills the ds_config's batch values itself from ``--per_device_train_batch_size``
and ``--gradient_accumulation_steps``, and refuses a config whose numbers disagree with them. So a
trial sets the micro-batch and the accumulation through those arguments (unless the user's own
``arg_mappings`` says otherwise) and leaves the batch keys of the config as the user had them.

transformers is imported only inside the script's processes, never here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError
from ._base import ScriptTarget
from ._command import UserCommand

MICRO, GAS = "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"
TRAINER_ARGS = {MICRO: "--per_device_train_batch_size", GAS: "--gradient_accumulation_steps"}
"""The Trainer's options for the two batch values a trial sets."""
TRAINER_DEFAULTS = {MICRO: 8, GAS: 1}
"""TrainingArguments' defaults for them, where the command does not give them."""

_USES_TRAINER = re.compile(r"\b(TrainingArguments|Seq2SeqTrainingArguments|HfArgumentParser)\b")
_IMPORTS_TRANSFORMERS = re.compile(r"^\s*(import|from)\s+transformers\b", re.M)


def looks_like_hf_trainer(script: str) -> bool:
    """The script builds Hugging Face ``TrainingArguments`` (directly or through
    ``HfArgumentParser``): read from its source, nothing is run."""
    try:
        text = Path(script).read_text(errors="replace")
    except OSError:
        return False
    return bool(_IMPORTS_TRANSFORMERS.search(text) and _USES_TRAINER.search(text))


@dataclass
class HfTrainerTarget(ScriptTarget):
    """A script that trains with Hugging Face's ``Trainer``."""

    command: UserCommand
    kind = "a Hugging Face Trainer script"

    def arg_mappings(self, config: dict, given: dict[str, str] | None) -> dict[str, str]:
        """The Trainer's batch options; the user's own ``arg_mappings`` win key by key. (Where
        the config has numbers, a trial writes the same numbers in both places: the Trainer
        refuses a config that disagrees with its arguments.)"""
        return {**TRAINER_ARGS, **(given or {})}

    @property
    def engine(self) -> str:
        """``fsdp`` where the command trains with FSDP (``--fsdp`` and no ``--deepspeed``)."""
        fsdp = "--fsdp" in self.command.args or any(a.startswith("--fsdp=") for a in self.command.args)
        return "fsdp" if fsdp and self.command.config_path() is None else "deepspeed"

    def fsdp_config_path(self) -> str | None:
        return self.command.option_value("--fsdp_config")

    def config_source(self, given):
        """Under FSDP the command names no ds_config: the DeepSpeed side searches every stage with
        the Trainer's own values ("auto"), at the command's precision."""
        if given is None and self.engine == "fsdp":
            from ..request import deepspeed_space

            return deepspeed_space(self.fsdp_settings({}).mixed_precision)
        return super().config_source(given)

    def trial_args(self, config, mapped: dict[str, str]) -> list[str]:
        """A DeepSpeed trial's arguments: the ds_config in place of the command's FSDP options
        where it trains with FSDP."""
        if self.engine == "deepspeed":
            return super().trial_args(config, mapped)
        return [*without_fsdp(self.command).trial_args(None, mapped), "--deepspeed", str(config.resolve())]

    def probe_fields(self, config):
        """The Trainer runs on Accelerate, whose CPU processes need zerotune's lift (see
        zerotune.accelerate_cpu)."""
        return {"accelerate": True}

    @property
    def fsdp(self):
        from ._fsdp_forms import HfTrainerFsdp

        return HfTrainerFsdp(without_fsdp(self.command))

    def fsdp_settings(self, ds_config: dict, wrap: tuple[str, ...] = ()):
        """The Trainer's precision is its ``--bf16``/``--fp16`` (its ds_config's "auto" follows
        them), the same under either engine."""
        from ..request import FsdpSettings

        wrap = wrap or self.own_wrap()
        for flag in ("--bf16", "--fp16"):
            value = self.command.option_value(flag)
            bare = flag in self.command.args and (value is None or value.startswith("-"))
            if bare or (value or "").lower() in ("true", "1", "yes"):
                return FsdpSettings(wrap=wrap, mixed_precision=flag[2:])
        return super().fsdp_settings(ds_config, wrap)

    def own_wrap(self) -> tuple[str, ...]:
        """The blocks the command's own ``--fsdp_config`` wraps (``transformer_layer_cls_to_wrap``)."""
        path = self.fsdp_config_path()
        if path is None or not path.endswith(".json"):
            return ()
        try:
            given = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--fsdp_config {path!r} cannot be read as JSON ({e}); fix the file") from None
        if not isinstance(given, dict):
            raise ConfigError(f"--fsdp_config {path!r} is not a JSON object of FSDP keys; fix the file")
        classes = given.get("transformer_layer_cls_to_wrap", given.get("fsdp_transformer_layer_cls_to_wrap"))
        if isinstance(classes, str):
            classes = [c.strip() for c in classes.split(",") if c.strip()]
        return tuple(classes) if isinstance(classes, list) and all(isinstance(c, str) for c in classes) else ()

    def script_batch(self, mappings: dict[str, str]) -> dict[str, int]:
        """The mapped options' values in the command, or TrainingArguments' defaults for the
        Trainer's own options where the command does not give them."""
        given = super().script_batch(mappings)
        return {
            **{
                k: TRAINER_DEFAULTS[k]
                for k, flag in mappings.items()
                if flag == TRAINER_ARGS.get(k) and self.command.option_value(flag) is None
            },
            **given,
        }


FSDP_OPTIONS = ("--fsdp", "--fsdp_config")


def without_fsdp(command: UserCommand) -> UserCommand:
    """``command`` without the Trainer's FSDP options (``--fsdp [value]``, ``--fsdp_config path``):
    what a trial adds its own engine's options to."""
    args, i, words = [], 0, list(command.args)
    while i < len(words):
        word = words[i]
        if word.split("=", 1)[0] in FSDP_OPTIONS:
            takes_value = "=" not in word and (
                word == "--fsdp_config" or (i + 1 < len(words) and not words[i + 1].startswith("-"))
            )
            i += 2 if takes_value else 1
            continue
        args.append(word)
        i += 1
    return UserCommand(command.script, tuple(args), command.local_rank, command.code)
