"""Text from scripts, configs and disk made safe for a terminal: no escape sequences, no control
characters, no rich markup. Every face that prints a name, reason, note or path uses this."""

from __future__ import annotations

import re

from rich.markup import escape

_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: object) -> str:
    """``text`` without terminal escape sequences and control characters (a tab or newline
    stays); undecodable bytes of a file name are shown as the replacement character."""
    s = str(text).encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("", _ESCAPES.sub("", s))


def safe(text: object) -> str:
    """``text`` for rich's console: :func:`plain`, and never read as markup."""
    return escape(plain(text))
