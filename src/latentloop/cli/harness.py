"""``latentloop harness``: lm-evaluation-harness tasks on a recurrent-depth checkpoint, one run per depth."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from latentloop.cli.app import REVISION, WEIGHTS, app, deprecated, int_list
from latentloop.errors import UsageError

INSTALL_HINT = "pip install 'latentloop[eval]' (or pip install lm-eval)"


def parse_tasks(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, with a one-line error for an empty name."""
    tasks = [part.strip() for part in text.split(",")]
    if not all(tasks):
        raise UsageError(f"--tasks must be comma-separated task names, got {text!r}")
    return tasks


def _load_harness():
    """The harness module, or a one-line error that says how to install lm-eval."""
    try:
        from latentloop.eval import harness
    except ImportError as error:
        if (error.name or "").startswith("latentloop"):
            raise
        raise UsageError(f"latentloop harness needs lm-eval ({error}): {INSTALL_HINT}") from None
    return harness


@app.command()
def harness(
    model: str = typer.Argument(
        ..., help="Checkpoint folder, a run folder (its newest checkpoint), or a Hub model id org/name."
    ),
    tasks: str = typer.Option(
        ..., "--tasks", help="Comma-separated lm-eval task names (its own, or from --include-path)."
    ),
    depths: str = typer.Option(
        None, "--depths", help="Comma-separated depths, one lm-eval run each (default: the model's mean)."
    ),
    num_steps: str = typer.Option(None, "--num-steps", hidden=True, help="Deprecated spelling of --depths."),
    revision: str = REVISION,
    include_path: Path = typer.Option(
        None, "--include-path", help="A folder of lm-eval task YAML files to add to lm-eval's own."
    ),
    limit: int = typer.Option(None, "--limit", help="Evaluate only the first N documents of each task."),
    num_fewshot: int = typer.Option(None, "--num-fewshot", help="Few-shot examples (default: the task's)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests per forward pass."),
    exit_criterion: str = typer.Option(
        None, "--exit", help="Generation tasks: per-token early exit, e.g. kl:5e-4 (see latentloop generate)."
    ),
    kv_share: int = typer.Option(None, "--kv-share", help="Generation tasks: core KV-cache slots."),
    init_scale: float = typer.Option(
        0.0, "--init-scale", help="Scale of the random initial state (0 = zeros: deterministic scores)."
    ),
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="tokenizer.json (default: the model's, else its run's, else bytes)."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
    weights: str = WEIGHTS,
    bootstrap_iters: int = typer.Option(
        100_000,
        "--bootstrap-iters",
        help="Bootstrap resamples for stderrs lm-eval cannot compute in closed form (0: none).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the table, the main metrics and lm-eval's full results as JSON."
    ),
) -> None:
    """Evaluate a recurrent-depth checkpoint with lm-evaluation-harness at each depth: one table of task x depth."""
    tasks_list = parse_tasks(tasks)
    if num_steps is not None:
        deprecated("--num-steps", "--depths")
        depths = num_steps if depths is None else depths
    depth_list = int_list(depths, "--depths")
    _check_counts(
        at_least_1={"--limit": limit, "--batch-size": batch_size, "--kv-share": kv_share},
        at_least_0={"--num-fewshot": num_fewshot, "--bootstrap-iters": bootstrap_iters},
    )
    if include_path is not None and not include_path.is_dir():
        raise UsageError(f"--include-path {include_path} is not a folder")
    lm_harness = _load_harness()
    # lm-eval reports every step at INFO and repeats its --limit warning per run; the table is what matters.
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    lm = lm_harness.LatentloopLM(
        model,
        revision=revision,
        tokenizer=tokenizer,
        exit=exit_criterion,
        kv_share=kv_share,
        init_scale=init_scale,
        batch_size=batch_size,
        device=device,
        weights=weights,
    )
    report = lm_harness.depth_sweep(
        lm,
        tasks_list,
        depth_list or [lm.num_steps],
        manager=lm_harness.task_manager(include_path),
        limit=limit,
        num_fewshot=num_fewshot,
        bootstrap_iters=bootstrap_iters,
    )
    settings = {key: value for key, value in lm.get_model_info().items() if key != "num_steps"}
    report = {"model": model, "settings": settings, **report}
    if as_json:
        typer.echo(json.dumps(report, default=str))
    else:
        typer.echo(lm_harness.format_table(report))


def _check_counts(at_least_1: dict[str, int | None], at_least_0: dict[str, int | None]) -> None:
    """A one-line error for the first count option below its least value (None: not given)."""
    for name, value in at_least_1.items():
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    for name, value in at_least_0.items():
        if value is not None and value < 0:
            raise UsageError(f"{name} must not be negative, got {value}")
