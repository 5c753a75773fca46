"""Errors that the command line turns into one clear line and exit status 2."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn


class UsageError(ValueError):
    """Bad input from the user: a wrong argument, file, config value or puzzle."""


# Integer options of the scripts that count something that must exist at least once.
AT_LEAST_ONE = ("threads", "repeats", "processes")


def whole_number(least: int) -> Callable[[str], int]:
    """An ``argparse`` type: an integer of at least ``least``, else argparse's one-line error naming the
    option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` for the scripts (``benchmarks/``), with the command line's way of refusing bad input: one
    ``error:`` line pointing to ``--help``, exit status 2 (argparse's own prints the usage as well).

    Every ``type=int`` option of the scripts is a count or a seed, so none takes a negative value, and
    ``--threads``, ``--repeats`` and ``--processes`` take at least 1."""

    def add_argument(self, *names: Any, **options: Any) -> argparse.Action:
        if options.get("type") is int:
            counted = any(str(name).lstrip("-") in AT_LEAST_ONE for name in names)
            options["type"] = whole_number(1 if counted else 0)
        return super().add_argument(*names, **options)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")
