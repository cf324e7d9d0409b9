"""MkDocs hooks: the reference pages are made from the code's own definitions, never written
twice. A page holds a marker (an HTML comment) that the hook replaces with the generated text:

- ``<!-- zerotune:cli -->``: each command's ``--help``, from the CLI's own parsers;
- ``<!-- zerotune:autotuning -->``: the ``autotuning`` keys, their defaults and meanings;
- ``<!-- zerotune:changelog -->``: CHANGELOG.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli_reference() -> str:
    from zerotune.cli import COMMANDS, TOP_HELP, command_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps the help to the terminal's width: fix it
    parts = ["```text", TOP_HELP.strip(), "```"]
    for name in COMMANDS:
        parts += ["", f"## zerotune {name}", "", "```text", command_parser(name).format_help().strip(), "```"]
    return "\n".join(parts)


def autotuning_reference() -> str:
    from zerotune.request import AutotuningConfig

    rows = ["| key | default | meaning |", "|---|---|---|"]
    for name, field in AutotuningConfig.model_fields.items():
        default = json.dumps(field.default)
        rows.append(f"| `{name}` | `{default}` | {field.description or ''} |")
    return "\n".join(rows)


GENERATED = {
    "<!-- zerotune:cli -->": cli_reference,
    "<!-- zerotune:autotuning -->": autotuning_reference,
    "<!-- zerotune:changelog -->": lambda: (ROOT / "CHANGELOG.md").read_text().split("\n", 1)[1].strip(),
}


def on_page_markdown(markdown: str, **kwargs) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
