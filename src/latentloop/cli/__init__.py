"""The ``latentloop`` command: parses arguments and calls the library; bad input exits 2 with one line."""

from __future__ import annotations

import sys

import typer

from latentloop.cli import bench, convert, generate, harness, run, sample, serve, tasks, train  # noqa: F401  (each module registers its commands)
from latentloop.cli.app import app
from latentloop.errors import UsageError

try:  # Typer >= 0.17 vendors Click under typer._click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older Typer uses Click itself
    from click import exceptions as click_errors


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a negative answer, 2 bad input)."""
    try:
        result = app(args=argv, standalone_mode=False, prog_name="latentloop")
    except click_errors.NoArgsIsHelpError:
        return 0
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 130
    except click_errors.ClickException as error:
        print(f"error: {error.format_message()}", file=sys.stderr)
        return 2
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a path given on the command line that cannot be read or written
        print(
            f"error: {error.filename}: {error.strerror}" if error.filename else f"error: {error}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
