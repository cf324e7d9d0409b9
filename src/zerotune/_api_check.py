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


def check_values(owner: str, cls: type, values: dict[str, Any]) -> None:
    """Each of ``values`` checked strictly against the annotation of the field of dataclass
    ``cls`` it sets; a wrong type is a ConfigError naming ``owner(field=...)``."""
    import dataclasses
    import typing

    from pydantic import ConfigDict, TypeAdapter, ValidationError

    hints = typing.get_type_hints(cls)
    config = ConfigDict(strict=True, arbitrary_types_allowed=True)
    for name, value in values.items():
        assert name in {f.name for f in dataclasses.fields(cls)}, f"{name} is not a field of {cls.__name__}"
        try:
            TypeAdapter(hints[name], config=config).validate_python(value)
        except ValidationError as e:
            raise ConfigError(_message(owner, [name], e, where=name)) from None


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


def _message(owner: str, names: list[str], err: Any, where: str | None = None) -> str:
    errors = err.errors()
    first = errors[0]
    loc = first["loc"][:1] if where is None else ()
    position = loc[0] if loc else where
    name = names[position] if isinstance(position, int) and position < len(names) else str(position)
    # A union reports one error per member: name what each member would take.
    expected = list(
        dict.fromkeys(
            _EXPECTED.get(e["type"], e["msg"].lower()) for e in errors if e["loc"][:1] == first["loc"][:1] or where
        )
    )
    got = first.get("input")
    text = f"{owner}({name}=...): got {got!r:.60}, which is not " + " or ".join(expected)
    if name == "command":
        text += (
            "; give the script and its arguments as a list, e.g. ['train.py', '--deepspeed_config', "
            "'ds.json'], or a function train(ds_config)"
        )
    return text
