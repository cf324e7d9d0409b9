"""Whether DeepSpeed's runner (``deepspeed script.py args``) hands a script's arguments to it
untouched. Its argparse takes abbreviations, so a script flag like ``--n`` can be read as its own
``--num_nodes``, or be refused as ambiguous; then the final command uses torchrun instead.

The exact answer needs DeepSpeed's parser, and importing DeepSpeed takes seconds in the tuner
process (3 s on the CI machine: 4% of a CPU tuning). So its option names are first read from its
source without importing it: arguments none of which can be taken for one of them need no parse.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import logging
import os
from pathlib import Path


def runner_accepts(argv: list[str], script: str, args: list[str], device: str) -> bool:
    """Whether DeepSpeed's runner, given ``argv`` (its own options, then ``script args``), would
    hand ``args`` to the script untouched."""
    options = runner_options()
    if options is not None and not any(may_be_taken(a, options) for a in [script, *args]):
        return True
    return _parsed_untouched(argv, script, args, device)


def may_be_taken(word: str, options: frozenset[str]) -> bool:
    """Whether argparse could read ``word`` as one of ``options`` (or as its end marker): an
    exact name, an abbreviation of a long one, or a short one with its value attached."""
    if word == "--":
        return True
    if not word.startswith("-") or word == "-":
        return False
    name = word.split("=", 1)[0]
    if name.startswith("--"):
        return any(o.startswith(name) for o in options)
    return any(o == word[:2] or o.startswith(name) for o in options)


@functools.cache
def runner_options() -> frozenset[str] | None:
    """The option strings of DeepSpeed's runner, read from its source (None where it cannot be
    read: then the exact parse decides)."""
    spec = importlib.util.find_spec("deepspeed")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "launcher" / "runner.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    parse_args = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "parse_args"), None)
    if parse_args is None:
        return None
    names = {
        a.value
        for call in ast.walk(parse_args)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
    }
    return frozenset(names | {"-h", "--help"}) if names else None


def _parsed_untouched(argv: list[str], script: str, args: list[str], device: str) -> bool:
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    # Importing DeepSpeed probes for an accelerator (and warns) unless told; tell it only for the
    # import, so that this process's environment is left as the caller had it.
    saved = os.environ.get("DS_ACCELERATOR")
    os.environ.setdefault("DS_ACCELERATOR", device)
    try:
        from deepspeed.launcher.runner import parse_args
    except ImportError:
        return True
    finally:
        if saved is None:
            os.environ.pop("DS_ACCELERATOR", None)
    try:
        parsed = parse_args(argv)
    except SystemExit:
        return False
    return parsed.user_script == script and list(parsed.user_args) == list(args)
