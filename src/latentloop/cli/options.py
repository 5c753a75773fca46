"""Command-line options derived from a dataclass's fields, so a setting is declared once: in the config.

A field with ``metadata={"help": ...}`` becomes ``--field-name`` (and any ``metadata["short"]`` flags), of the
field's type and default. :func:`with_options` gives a command these options on top of its own parameters; the
command receives them as keyword arguments, by field name.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer


def options_of(cls: type, types: dict[str, Any] | None = None) -> list[inspect.Parameter]:
    """The options of ``cls``'s fields that have a help text; ``types`` replaces a field's type where the
    command line takes another (``str`` for a field that also takes objects)."""
    hints = typing.get_type_hints(cls)
    types = types or {}
    options = []
    for field in dataclasses.fields(cls):
        if "help" not in field.metadata:
            continue
        flags = ["--" + field.name.replace("_", "-"), *field.metadata.get("short", ())]
        default = typer.Option(
            field.default, *flags, help=field.metadata["help"], show_default=field.default is not None
        )
        kind = inspect.Parameter.KEYWORD_ONLY
        options.append(
            inspect.Parameter(
                field.name, kind, default=default, annotation=types.get(field.name, hints[field.name])
            )
        )
    return options


def with_options(*options: list[inspect.Parameter]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator: the command's own parameters (its ``**settings`` left out), then ``options``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        hints = typing.get_type_hints(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in own]
        command.__signature__ = signature.replace(parameters=[*own, *(p for group in options for p in group)])
        command.__annotations__ = {}
        return command

    return decorate
