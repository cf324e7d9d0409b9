"""The HTML report, made from what a results folder holds (never from a running tuning)."""

from ._html import write_report

__all__ = ["write_report"]
