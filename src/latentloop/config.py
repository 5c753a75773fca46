"""Configs are data: dataclasses that load from YAML, take ``key=value`` overrides and save next to checkpoints."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from latentloop.errors import UsageError
from latentloop.io import atomic_write_text

T = TypeVar("T")


def option(default: Any, help: str, *short: str) -> Any:
    """A dataclass field that a command line offers as ``--field-name`` (and ``short`` flags), with its help
    text (:func:`latentloop.cli.options.options_of`)."""
    return dataclasses.field(default=default, metadata={"help": help, "short": short})


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """Convert ``value`` (from YAML or a command-line string) to ``annotation``, with a clear error."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except UsageError as error:
                errors.append(str(error))
        raise UsageError(errors[0] if errors else f"{name}: cannot parse {value!r}")
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise UsageError(f"{name}: expected a mapping, got {value!r}")
        return from_dict(annotation, value, prefix=f"{name}.")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()] if value.strip() else []
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{name}: expected a list, got {value!r}")
        item_type = args[0] if args else str
        items = [_coerce(v, item_type, name) for v in value]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise UsageError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise UsageError(f"{name}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise UsageError(f"{name}: expected an integer, got {value!r}")
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{name}: expected an integer, got {value!r}") from None
        if not as_float.is_integer():
            raise UsageError(f"{name}: expected an integer, got {value!r}")
        return int(as_float)
    if annotation is float:
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{name}: expected a number, got {value!r}") from None
        if result != result or result in (float("inf"), float("-inf")):
            raise UsageError(f"{name}: expected a finite number, got {value!r}")
        return result
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise UsageError(f"{name}: expected a string, got {value!r}")
        return str(value)
    if annotation is Any:
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "", strict: bool = True) -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys are an error when ``strict``."""
    if not isinstance(data, dict):
        raise UsageError(f"config: expected a mapping, got {type(data).__name__}")
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown and strict:
        raise UsageError(f"unknown config key {prefix}{unknown[0]!r} (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items() if k in names}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise UsageError(f"invalid config: {error}") from None


def to_dict(config: Any) -> dict[str, Any]:
    """A plain mapping of a dataclass config (nested dataclasses included)."""
    return dataclasses.asdict(config)


def apply_overrides(config: T, overrides: list[str]) -> T:
    """Return a copy of ``config`` with ``key=value`` (dotted keys reach nested configs) applied."""
    data = to_dict(config)
    for item in overrides:
        if "=" not in item:
            raise UsageError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key:
            raise UsageError(f"override {item!r} has an empty key")
        target = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(target.get(part), dict):
                raise UsageError(f"unknown config key {key!r}")
            target = target[part]
        if parts[-1] not in target:
            raise UsageError(f"unknown config key {key!r} (known: {', '.join(sorted(target))})")
        # A string field keeps the raw text ("1e-3" stays a string); others go through YAML scalars.
        if isinstance(target[parts[-1]], str) or not value.strip():
            target[parts[-1]] = value
        else:
            try:
                target[parts[-1]] = yaml.safe_load(value)
            except yaml.YAMLError:
                target[parts[-1]] = value
    return from_dict(type(config), data)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with a one-line error on a missing, malformed or empty file (an empty config would
    otherwise run every default silently)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise UsageError(f"cannot read config {path}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UsageError(f"config {path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if data is None:
        raise UsageError(f"config {path} is empty: it must hold a mapping of settings")
    if not isinstance(data, dict):
        raise UsageError(f"config {path} must hold a mapping at its top level")
    return data


def check_repeated_keys(overrides: list[str]) -> None:
    """A one-line error naming a key that ``key=value`` overrides given by a user set twice to different
    values (``train.steps=1 train.steps=-5``): the later would win silently."""
    seen: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        key = key.strip()
        if key in seen and seen[key] != value.strip():
            first, second = (
                text if text.isprintable() else repr(text) for text in (seen[key], value.strip())
            )
            raise UsageError(f"{key} is set twice, to {first} and to {second}: give it once")
        seen[key] = value.strip()


def save_yaml(config: Any, path: str | Path) -> None:
    """Write a dataclass config as YAML, atomically."""
    data = config if isinstance(config, dict) else to_dict(config)
    atomic_write_text(Path(path), yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False))
