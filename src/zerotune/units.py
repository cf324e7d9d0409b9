"""Human sizes (``16GB``, ``1.5GiB``, ``800M``) and durations (``20m``, ``90s``)."""

from __future__ import annotations

import math
import re

from ._errors import ConfigError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
GIB = 1024**3


MAX_SIZE = 2**60
"""An exabyte: no memory figure of a real machine comes near it."""


def parse_size(text: str | int | float, *, what: str = "size", limit: int = MAX_SIZE) -> int:
    """Bytes from ``text``; decimal units (GB) are powers of 1000, binary ones (GiB) of 1024."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = _SIZE_RE.match(str(text))
        if not match or match.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(f"{what}: cannot read {text!r} as a size; write it like 16GB, 80GiB or 512MiB")
        value, unit = float(match.group(1)), match.group(2).lower()
    value *= _SIZE_UNITS[unit]
    if not math.isfinite(value) or value > limit:
        raise ConfigError(
            f"{what}: {text!r} is beyond any real machine (at most {format_size(limit)}); write it "
            "like 16GB, 80GiB or 512MiB"
        )
    size = int(value)
    if size <= 0:
        raise ConfigError(f"{what}: {text!r} must be larger than zero")
    return size


MAX_SECONDS = 30 * 24 * 3600.0


def positive_seconds(value: float, what: str) -> float:
    """A number of seconds that is finite, above zero and at most 30 days."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a number of seconds") from None
    if not (0 < seconds <= MAX_SECONDS):  # also false for NaN
        raise ConfigError(
            f"{what}: {value!r} must be a number of seconds above 0 and at most {MAX_SECONDS:.0f} (30 days)"
        )
    return seconds


def parse_duration(text: str | int | float, *, what: str = "duration") -> float:
    """Seconds from ``90``, ``90s``, ``20m``, ``1.5h``."""
    match = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*$", str(text), re.IGNORECASE)
    if not match:
        raise ConfigError(f"{what}: cannot read {text!r} as a duration; write it like 90s, 20m or 1.5h")
    seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2).lower()]
    return positive_seconds(seconds, what)


def format_size(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 1024**2:.0f} MiB"


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min, 3.2 h, 2.1 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
MAX_PARAMS = 10**14
"""Beyond any model trained today: a typo, not a model."""


def is_count(text: str) -> bool:
    """Whether ``text`` is written as a count (``350M``, ``7e9``), plausible or not."""
    return bool(_COUNT.match(str(text)))


def parse_count(text: str, *, what: str) -> int:
    """``1.3B``, ``350M``, ``7e9``, ``125000000``."""
    match = _COUNT.match(str(text))
    if not match:
        raise ConfigError(f"{what}: cannot read {text!r} as a number of parameters; write it like 1.3B, 350M or 7e9")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    if not 1 <= value <= MAX_PARAMS:
        raise ConfigError(f"{what}: {text!r} is not a plausible parameter count (1 to 100T)")
    return int(value)
