"""``latentloop convert``: official TinyRecursiveModels/HRM checkpoints as latentloop runs."""

from __future__ import annotations

import json

import typer

from latentloop.cli.app import app


@app.command("convert")
def convert(
    kind: str = typer.Argument(..., help="The official model: trm or hrm."),
    checkpoint: str = typer.Argument(..., help="A checkpoint file written by the official pretrain.py."),
    config: str = typer.Option(
        ...,
        "--config",
        help="The official run's all_config.yaml, or its architecture yaml (config/arch/*.yaml).",
    ),
    out: str = typer.Option(..., "--out", help="The folder to write (must not exist, or be empty)."),
    task: str = typer.Option(
        None,
        "--task",
        help="The task it solves (e.g. sudoku, or sudoku:data=DIR): OUT becomes a run folder that eval, solve "
        "and train take. Without it OUT is a checkpoint folder.",
    ),
    seq_len: int = typer.Option(
        None,
        "--seq-len",
        help="Puzzle length, for attention models without --task (mlp_t's weights hold it).",
    ),
    overrides: list[str] = typer.Argument(None, help="key=value settings of the run config (train.lr=1e-4)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Convert a checkpoint of the official TinyRecursiveModels or HRM code into latentloop's format: the
    same model (logits, Q-values and carried states agree with the official code), ready for ``eval``,
    ``solve --model`` and ``train``."""
    from latentloop.convert import convert_run

    folder = convert_run(kind, checkpoint, config, out, task=task, seq_len=seq_len, overrides=overrides or [])
    if as_json:
        typer.echo(json.dumps({"out": str(folder), "kind": kind, "task": task}))
    else:
        typer.echo(f"converted {kind} checkpoint {checkpoint} into {folder}")
