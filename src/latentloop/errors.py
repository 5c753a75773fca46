"""Errors that the command line turns into one clear line and exit status 2."""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(ValueError):
    """Bad input from the user: a wrong argument, file, config value or puzzle."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` for the scripts (``benchmarks/``), with the command line's way of refusing bad input: one
    ``error:`` line pointing to ``--help``, exit status 2 (argparse's own prints the usage as well)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")
