"""latentloop CLI: ``data build``, ``check`` and ``solve`` for the structured-reasoning tasks.

Task options come as ``TASK:key=value,...``, as ``--n``/``--colors``, or as any ``--key value`` after the
positional arguments (e.g. ``latentloop data build sudoku --out d --tier hard --augment 4``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from latentloop.cli.app import REVISION, app, data_app
from latentloop.errors import UsageError
from latentloop.tasks.base import Task, format_task_spec, get_task, parse_task_spec

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def _extra_options(args: list[str]) -> dict[str, str]:
    """``--key value`` / ``--key=value`` pairs left over by the parser (a bare ``--flag`` means true)."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise UsageError(
                f"unexpected argument {arg!r} (task options go as --key value or TASK:key=value)"
            )
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            else:
                value = "true"
        options[key.replace("-", "_")] = value
        i += 1
    return options


def _task(spec: str, ctx: typer.Context, **named: Any) -> tuple[Task, dict[str, str]]:
    """The task named by ``spec`` with options from the spec, the named options and the leftover arguments."""
    name, options = parse_task_spec(spec)
    options.update({k: str(v) for k, v in named.items() if v is not None})
    options.update(_extra_options(list(ctx.args)))
    return get_task(name, **options), options


def _emit(as_json: bool, payload: dict[str, Any], text: str) -> None:
    typer.echo(json.dumps(payload) if as_json else text)


# ------------------------------------------------------------------------------------------------------
# data build
# ------------------------------------------------------------------------------------------------------


@data_app.command("build", context_settings=_EXTRA)
def build(
    ctx: typer.Context,
    task: str = typer.Argument(..., help="Task name, optionally with options: nqueens:n=10"),
    out: str = typer.Option(..., "--out", help="Dataset folder to write (atomically)."),
    size: int | None = typer.Option(None, "--size", help="Training puzzles (distinct inputs); default: all."),
    test_size: int | None = typer.Option(None, "--test-size", help="Test puzzles; default: all."),
    seed: int = typer.Option(0, "--seed", help="Seed: the same seed gives the same files."),
    n: str | None = typer.Option(None, "--n", help="Task option n (board side / vertices)."),
    colors: str | None = typer.Option(None, "--colors", help="Task option colors (graph colouring)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON."),
) -> None:
    """Build a task's train and test splits as numpy arrays plus metadata.json."""
    from latentloop.data.dataset import build_dataset

    the_task, options = _task(task, ctx, n=n, colors=colors)
    metadata = build_dataset(
        the_task, out, size=size, test_size=test_size, seed=seed, force=force, spec=options
    )
    counts = metadata["counts"]
    text = "\n".join(
        [f"wrote {out}  (seq_len {metadata['seq_len']}, vocab {metadata['vocab_size']})"]
        + [
            f"  {split}: {c['rows']} rows, {c['puzzles']} puzzles, {c['groups']} groups"
            for split, c in counts.items()
        ]
    )
    _emit(as_json, {"out": out, "task": the_task.name, **counts}, text)


# ------------------------------------------------------------------------------------------------------
# check
# ------------------------------------------------------------------------------------------------------


@app.command("check", context_settings=_EXTRA)
def check(
    ctx: typer.Context,
    task: str = typer.Argument(..., help="Task name (options as TASK:key=value or --key value)."),
    puzzle: str = typer.Argument(..., help="The puzzle in the task's text form."),
    answer: str = typer.Argument(..., help="The answer in the task's text form."),
    n: str | None = typer.Option(None, "--n", help="Task option n."),
    colors: str | None = typer.Option(None, "--colors", help="Task option colors."),
    as_json: bool = typer.Option(False, "--json", help='Print {"valid": bool, "violations": int}.'),
) -> None:
    """Check an answer with the task's verifier: exit 0 when valid, 1 when not, 2 on bad input."""
    the_task, _ = _task(task, ctx, n=n, colors=colors)
    the_puzzle = the_task.parse(puzzle)
    the_answer = the_task.parse_answer(answer, the_puzzle)
    violations = int(the_task.violations(the_puzzle, the_answer))
    valid = violations == 0
    _emit(
        as_json,
        {"valid": valid, "violations": violations},
        "valid" if valid else f"invalid: {violations} violations",
    )
    if not valid:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------------------------
# solve
# ------------------------------------------------------------------------------------------------------


def _checkpoint_task(model: str, task: Task, options: dict[str, str]) -> str | None:
    """The task spec of a checkpoint outside a run folder: that of its ``run.yaml`` (a shipped model, or a copy
    of one from the Hub), else the task named on the command line; ``None`` inside a run (its config says)."""
    from latentloop.pretrained import pretrained_task_spec
    from latentloop.train.checkpoint import resolve_checkpoint, run_folder_of

    checkpoint = resolve_checkpoint(model)
    if run_folder_of(checkpoint) is not None:
        return None
    if (checkpoint / "run.yaml").is_file():
        try:
            return pretrained_task_spec(checkpoint)
        except (KeyError, TypeError, AttributeError):
            raise UsageError(f"{checkpoint / 'run.yaml'} has no task section with a name") from None
    return ":".join([task.name, ",".join(f"{key}={value}" for key, value in options.items())]).rstrip(":")


# The options of `latentloop solve` whose help takes more than a line.
_MODEL = typer.Option(
    None,
    "--model",
    help="Use a trained model (run folder, checkpoint or Hub model id org/name); default: the pretrained one.",
)
_SAMPLES = typer.Option(
    None,
    "--samples",
    help="With a model: parallel samples, chosen by --select (default: the shipped model's setting, else 1).",
)
_STEPS = typer.Option(
    None,
    "--steps",
    help="With a model: supervision steps (default: the shipped model's setting, else n_sup).",
)
_STATE_NOISE = typer.Option(
    None,
    "--state-noise",
    help="With a deterministic model: noise on its latent state, so its samples differ (noisy TRM).",
)


def _shipped(task: str) -> str:
    """What the shipped models of ``task`` take, for an error about a puzzle none of them takes."""
    from latentloop.pretrained import pretrained_task_spec, pretrained_variants

    shipped = [pretrained_task_spec(path) for path in pretrained_variants()[task]]
    takes_what = "models take" if len(shipped) > 1 else "model takes"
    return f"(the pretrained {task} {takes_what} {' or '.join(shipped)} puzzles; use --exact or --model RUN for others)"


def _choose_model(
    ctx: typer.Context,
    the_task: Task,
    options: dict[str, Any],
    puzzle: str,
    exact: bool,
    model: str | None,
    revision: str | None,
) -> tuple[Task, Path | None, str | None, str | None]:
    """``solve``'s model: ``(task, pretrained folder, model, model's task spec)``. Without --exact or --model,
    the shipped model whose puzzle size this puzzle has; a shipped model (or its copy) fixes the puzzle size
    when no task option is given."""
    pretrained = None
    if not exact and model is None:
        from latentloop.pretrained import (
            pretrained_model,
            pretrained_task_spec,
        )

        def takes(folder: Path) -> bool:  # the shipped model whose task options and puzzle size these are
            spec = pretrained_task_spec(folder)
            shipped = parse_task_spec(spec)[1]
            if any(key in shipped and shipped[key] != str(value) for key, value in options.items()):
                return False
            try:
                _task(spec, ctx)[0].parse(puzzle)
            except UsageError:
                return False
            return True

        pretrained = pretrained_model(the_task.name, fits=takes)
        if options and not takes(pretrained):
            raise UsageError(
                f"no shipped model takes {format_task_spec(the_task.name, options)} {_shipped(the_task.name)}"
            )
        model = str(pretrained)
        if not options:  # the shipped model fixes the puzzle size (e.g. 6x6 Sudoku)
            the_task, _ = _task(pretrained_task_spec(pretrained), ctx)
    model_task = None
    if model is not None and pretrained is None:
        from latentloop.hub import resolve_model

        model = str(resolve_model(model, revision))
        model_task = _checkpoint_task(model, the_task, options)
        if model_task is not None and not options:  # a shipped model's copy fixes the puzzle size too
            the_task, _ = _task(model_task, ctx)
    return the_task, pretrained, model, model_task


@app.command("solve", context_settings=_EXTRA)
def solve(
    ctx: typer.Context,
    task: str = typer.Argument(..., help="Task name (options as TASK:key=value or --key value)."),
    puzzle: str = typer.Argument(..., help="The puzzle in the task's text form."),
    exact: bool = typer.Option(False, "--exact", help="Use the classical exact solver."),
    model: str | None = _MODEL,
    revision: str | None = REVISION,
    all_: bool = typer.Option(
        False, "--all", help="List every solution (up to --limit); with a model, the distinct valid samples."
    ),
    limit: int | None = typer.Option(None, "--limit", help="Most solutions to list with --all."),
    n: str | None = typer.Option(None, "--n", help="Task option n."),
    colors: str | None = typer.Option(None, "--colors", help="Task option colors (graph colouring)."),
    samples: int | None = _SAMPLES,
    select: str | None = typer.Option(
        None, "--select", help="With a model: vote, value, first or q (the halting head); default vote."
    ),
    steps: int | None = _STEPS,
    state_noise: float | None = _STATE_NOISE,
    seed: int = typer.Option(
        0, "--seed", help="With a model: seed of the sampling noise (same seed, same answer)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Solve a puzzle with the exact solver (--exact), a trained model (--model), or else the pretrained model
    shipped for the task, at the test-time setting it ships with (its solve.yaml); exit 1 when unsolved."""
    if exact and model is not None:
        raise UsageError("choose one solver: --exact (the classical exact solver) or --model RUN")
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    if limit is not None and not exact:
        raise UsageError("--limit caps the list of --exact --all; a model lists at most --samples answers")
    the_task, options = _task(task, ctx, n=n, colors=colors)
    the_task, pretrained, model, model_task = _choose_model(
        ctx, the_task, options, puzzle, exact, model, revision
    )
    try:
        the_puzzle = the_task.parse(puzzle)
    except UsageError as error:
        if pretrained is None:
            raise
        raise UsageError(f"{error} {_shipped(the_task.name)}") from None
    if exact:
        payload, text, solved = the_task.solve_exact(the_puzzle, all_, limit)
    else:
        from latentloop.infer.solve import solve_puzzle
        from latentloop.pretrained import pretrained_task_spec, solve_setting

        setting = solve_setting(
            pretrained, steps=steps, samples=samples, select=select, state_noise=state_noise
        )
        if setting["samples"] < 1:
            raise UsageError(f"--samples must be at least 1, got {setting['samples']}")
        payload, text, solved = solve_puzzle(
            model or "",
            the_task,
            the_puzzle,
            model_task=pretrained_task_spec(pretrained) if pretrained else model_task,
            list_valid=all_,
            seed=seed,
            **setting,
        )
    _emit(as_json, payload, text)
    if not solved:
        raise typer.Exit(1)
