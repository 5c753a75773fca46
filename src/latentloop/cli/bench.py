"""``latentloop bench``: the benchmark scripts of a source checkout (``benchmarks/*.py``), run by name."""

from __future__ import annotations

import ast
import os
import runpy
import sys
from pathlib import Path

import typer

from latentloop.cli.app import app
from latentloop.errors import UsageError

# --help after the name reaches the script; the command's own help is `latentloop bench --help`.
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def benchmarks_folder() -> Path:
    """The ``benchmarks/`` folder: ``$LATENTLOOP_BENCHMARKS``, else the working directory's, else the one beside
    the package's source checkout (an editable install, as ``scripts/setup.sh`` makes)."""
    candidates = (
        [Path(os.environ["LATENTLOOP_BENCHMARKS"])] if os.environ.get("LATENTLOOP_BENCHMARKS") else []
    )
    candidates += [Path.cwd() / "benchmarks", Path(__file__).resolve().parents[3] / "benchmarks"]
    for folder in candidates:
        if folder.is_dir() and any(folder.glob("*.py")):
            return folder
    raise UsageError(
        "no benchmarks/ folder found: the benchmarks ship with latentloop's source checkout; run this from its "
        "root or set LATENTLOOP_BENCHMARKS"
    )


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
