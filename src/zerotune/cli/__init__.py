"""The ``zerotune`` command: parsers, terminal rendering, live progress, tracking and
``zerotune estimate``. The work is the Autotuner's."""

from .._lazy import lazy_exports
from ._main import main
from ._parsers import COMMANDS, TOP_HELP, command_parser

__getattr__ = lazy_exports(__name__, {"ProgressPrinter": "_progress", "print_summary": "_render"})
"""The Lightning strategy's terminal output, loaded on first use: ``zerotune --help`` imports no rich."""

__all__ = ["COMMANDS", "TOP_HELP", "command_parser", "ProgressPrinter", "main", "print_summary"]
