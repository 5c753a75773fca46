"""``latentloop bench``: the benchmark scripts that ship in the package (``benchmarks/*.py``), run by name."""

from __future__ import annotations

import ast
import os
import runpy
import sys
from pathlib import Path

import typer

from latentloop.cli.app import app
from latentloop.errors import UsageError
from latentloop.paths import BENCHMARKS_DIR

# --help after the name reaches the script; the command's own help is `latentloop bench --help`.
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def benchmarks_folder() -> Path:
    """The benchmark scripts: ``$LATENTLOOP_BENCHMARKS`` when set, else the ``benchmarks/`` that ships in the
    package (in a source checkout with its editable install, the repository's ``benchmarks/``)."""
    override = os.environ.get("LATENTLOOP_BENCHMARKS")
    folder = Path(override) if override else BENCHMARKS_DIR
    if not (folder.is_dir() and any(folder.glob("*.py"))):
        where = "LATENTLOOP_BENCHMARKS" if override else "the installed package"
        raise UsageError(f"no benchmark scripts (*.py) in {folder} ({where})")
    return folder


def available_benchmarks(folder: Path) -> dict[str, str]:
    """Benchmark name -> the first line of its docstring, read without importing the script."""
    found = {}
    for script in sorted(folder.glob("*.py")):
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
        found[script.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return found


@app.command("bench", context_settings=_PASS_THROUGH)
def bench(
    ctx: typer.Context,
    name: str | None = typer.Argument(
        None, help="The benchmark (see --list); the arguments after it go to it."
    ),
    list_: bool = typer.Option(False, "--list", help="List the benchmarks with what each measures."),
) -> None:
    """Run a benchmark by name: it prints one JSON object (``--output FILE`` also writes it). Options after the
    name are the benchmark's own: ``latentloop bench reasoners --help``."""
    if name in (None, "--help", "-h") and not list_:
        typer.echo(ctx.get_help())
        return
    folder = benchmarks_folder()
    known = available_benchmarks(folder)
    if list_:
        width = max(map(len, known), default=0)
        for bench_name, summary in known.items():
            typer.echo(f"{bench_name:<{width}}  {summary}")
        return
    if name not in known:
        raise UsageError(f"unknown benchmark {name!r} (known: {', '.join(known)})")
    saved_argv = sys.argv
    sys.argv = [str(folder / f"{name}.py"), *ctx.args]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as done:  # argparse's --help and errors, and the scripts' own exit status
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
        if code:
            raise typer.Exit(code) from None
    finally:
        sys.argv = saved_argv
