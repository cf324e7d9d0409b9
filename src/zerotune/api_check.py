"""The Python API's arguments, checked once where they enter: a wrong type is a ConfigError (a
ValueError) that names the argument, never a silent truthy value (``overwrite="no"`` deleting
trials) or a TypeError from deep inside.

Checked strictly, with pydantic's ``validate_call``: a bool must be True or False, a count an
int (not ``"2"``, ``2.5`` or ``True``), a callback callable, a command a list of strings.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ._errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

_EXPECTED = {
    "bool_type": "True or False",
    "int_type": "a whole number (an int)",
    "float_type": "a number",
    "callable_type": "a function",
    "list_type": "a list",
    "string_type": "a string",
    "is_instance_of": "an instance of the class its annotation names",
    "dict_type": "a dict",
}


def checked(func: F) -> F:
    """``func`` with its annotated arguments checked strictly on every call."""
    from pydantic import ConfigDict, ValidationError, validate_call

    validated = validate_call(func, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
    names = list(inspect.signature(func).parameters)
    owner = func.__qualname__.split(".")[0] if func.__name__ == "__init__" else func.__name__

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return validated(*args, **kwargs)
        except ValidationError as e:
            if e.title not in (func.__name__, func.__qualname__):
                raise  # raised inside the call, not about its arguments
            raise ConfigError(_message(owner, names, e)) from None

    return call  # type: ignore[return-value]


def renamed(old_value: Any, value: Any, *, old: str, new: str) -> Any:
    """The value of an argument given under its new name or, with a FutureWarning, its old one
    (both at once is a ConfigError)."""
    if old_value is None:
        return value
    if value is not None:
        raise ConfigError(f"{old}= and {new}= are one setting; give only {new}=")
    import warnings

    warnings.warn(f"{old}= is now called {new}=; the old name will go in a later release", FutureWarning, stacklevel=3)
    return old_value


def _message(owner: str, names: list[str], err: Any) -> str:
    errors = err.errors()
    first = errors[0]
    where = first["loc"][0]
    name = names[where] if isinstance(where, int) and where < len(names) else str(where)
    # A union reports one error per member: name what each member would take.
    expected = list(
        dict.fromkeys(_EXPECTED.get(e["type"], e["msg"].lower()) for e in errors if e["loc"][:1] == first["loc"][:1])
    )
    got = first.get("input")
    text = f"{owner}({name}=...): got {got!r:.60}, which is not " + " or ".join(expected)
    if name == "command":
        text += (
            "; give the script and its arguments as a list, e.g. ['train.py', '--deepspeed_config', "
            "'ds.json'], or a function train(ds_config)"
        )
    return text
