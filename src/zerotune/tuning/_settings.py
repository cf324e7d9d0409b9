"""The search's settings, and the Python API's options sorted into the three settings objects:
each option is a field of exactly one of them, under the same name on every face."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from .._api_check import check_values, renamed
from .._errors import ConfigError
from ..launch import ClusterSettings
from ..request import parse_engines, parse_search, parse_wrap
from ..search import Searcher
from ..trials import MeasureSettings
from ..units import parse_duration


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """What is searched and for how long."""

    searcher: Searcher | None = None
    """A searcher in place of the micro-batch search and the phases after it."""
    offload: bool | None = None
    """True searches offload to CPU too; False never; None only when nothing fits without it."""
    time_budget: float | str | None = None
    """Wall-clock seconds (or "20m") after which no trial starts."""
    retry_failed: bool = False
    """Run again the stored trials that failed (else only when the timeouts or the memory budget
    that failed them changed)."""
    search: str | list[str] | None = None
    """What to search around the user's own config (``--search``): any of "stage",
    "micro-batch", "offload", "knobs", as a list or "stage,micro-batch"; the rest of the config
    stays as the user set it. Default: the autotuning section's meanings where the config has one,
    else the stage and the micro-batch at the user's global batch (and offload where it offloads)."""

    engines: str | list[str] | None = None
    """The engines to tune and choose across (``--engines deepspeed,fsdp``): "deepspeed" (ZeRO) and
    "fsdp" (PyTorch FSDP2, for programs whose framework picks the engine: a Hugging Face Trainer or
    an Accelerate script). Default: the engine the program is configured for."""
    fsdp_wrap: str | list[str] | None = None
    """FSDP2's unit: class names of the model's blocks, each sharded as one (``--fsdp-wrap Block``),
    or a unit's parameter count (``"10M"``: each module of at least that many parameters); default:
    the model's own ``_no_split_modules`` (Hugging Face models), else the whole model."""

    def __post_init__(self) -> None:
        check_values(type(self).__name__, type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if self.time_budget is not None:
            parse_duration(self.time_budget, what="time_budget (--time-budget)")
        parse_search(self.search)
        parse_engines(self.engines)
        parse_wrap(self.fsdp_wrap)

    @property
    def dimensions(self) -> frozenset[str] | None:
        """``search`` as the set of what is searched around the user's config; None: not given."""
        return parse_search(self.search)

    @property
    def time_budget_seconds(self) -> float | None:
        return parse_duration(self.time_budget, what="time_budget (--time-budget)") if self.time_budget else None


GROUPS: dict[str, type] = {"cluster": ClusterSettings, "measure": MeasureSettings, "search": SearchSettings}
"""The Autotuner's settings objects, by the name of its argument."""
_FIELD_GROUP = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


def settings_of(options: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The three settings objects from ``given`` (those passed whole, by group name) and
    ``options`` (single fields by name; None means the default). A field given both ways, or a
    name that is no field, is a ConfigError naming it."""
    if "budget" in options:
        options["time_budget"] = renamed(
            options.pop("budget"), options.get("time_budget"), old="budget", new="time_budget"
        )
    fields: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for name, value in options.items():
        group = _FIELD_GROUP.get(name)
        if group is None:
            close = difflib.get_close_matches(name, [*_FIELD_GROUP, *GROUPS], n=1)
            hint = f"; did you mean {close[0]}=?" if close else ""
            raise ConfigError(f"Autotuner() got an unknown argument {name}={value!r:.40}{hint}")
        if value is None:
            continue
        if given.get(group) is not None:
            raise ConfigError(f"{name}= is a field of {group}=; give it there or by name, not both")
        fields[group][name] = value
    out = {}
    for group, cls in GROUPS.items():
        if given.get(group) is not None:
            out[group] = given[group]
        else:
            check_values("Autotuner", cls, fields[group])
            out[group] = cls(**fields[group])
    return out
