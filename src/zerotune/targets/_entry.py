"""Runs an in-Python training function as a trial's (or the final run's) program:

    python _entry.py MODULE:FUNCTION --deepspeed_config ds.json
    python _entry.py path/to/file.py:FUNCTION --deepspeed_config ds.json

FUNCTION is called with the ds_config as a dict, in every rank; it calls deepspeed.initialize
with it. This is how ``Autotuner(train_fn, ds_config)`` runs ``train_fn`` in trial processes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from zerotune._errors import ConfigError  # absolute: this file also runs as a script


def entry_args(fn: Callable) -> list[str]:
    """The arguments of this script that run ``fn``: its target, and the folder from which its
    module imports (trial processes do not share this process's sys.path)."""
    target = target_of(fn)
    module = sys.modules.get(fn.__module__)
    file = getattr(module, "__file__", None)
    if target.endswith(f":{fn.__qualname__}") and not target.startswith("/") and file:
        root = Path(file).resolve().parent
        for _ in range(fn.__module__.count(".") + (Path(file).name == "__init__.py")):
            root = root.parent
        return [target, "--path", str(root)]
    return [target]


def target_of(fn: Callable) -> str:
    """``module:qualname`` (or ``file.py:qualname`` for a script's own functions) that a new
    process can import; a clear error for lambdas, nested functions and notebook cells."""
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not qualname or "<" in qualname:
        raise ConfigError(
            f"{fn!r} cannot be run in trial processes: define it at the top level of a module "
            "(not a lambda or a nested function)"
        )
    if module == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if not main_file:
            raise ConfigError(
                f"{qualname} is defined in an interactive session; trial processes cannot import "
                "it. Put it in a .py file and import it from there"
            )
        return f"{os.path.abspath(main_file)}:{qualname}"
    if module is None:
        raise ConfigError(f"{fn!r} has no module; pass a function defined in a .py file")
    return f"{module}:{qualname}"


def load(target: str) -> Callable:
    where, _, qualname = target.rpartition(":")
    if not where or not qualname:
        raise ConfigError(f"entry point {target!r} must look like module:function or file.py:function")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location("__zerotune_entry__", where)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot load {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["__zerotune_entry__"] = module
        sys.path.insert(0, os.path.dirname(where))
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(where)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="module:function or file.py:function")
    parser.add_argument("--deepspeed_config", required=True, help="the ds_config JSON file")
    parser.add_argument("--path", action="append", default=[], help="a folder to import the module from")
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # DeepSpeed's runner passes it
    args = parser.parse_args()
    sys.path[:0] = args.path
    fn = load(args.target)
    fn(json.loads(Path(args.deepspeed_config).read_text()))


if __name__ == "__main__":
    main()
