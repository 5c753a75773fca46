"""latentloop CLI: ``train`` and ``eval``. Parses arguments and calls the library; nothing else."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from latentloop.cli.app import REVISION, TEMPERATURE, app, data_app, deprecated, int_list  # noqa: F401
from latentloop.cli.options import options_of, with_options
from latentloop.config import check_repeated_keys, option
from latentloop.errors import UsageError


def _budget_overrides(overrides: list[str], steps: int | None, budget_minutes: float | None) -> list[str]:
    """``--steps`` and ``--budget-minutes`` as ``train.*`` overrides after the user's own; a key the user gave
    twice, or both as an option and as ``key=value``, with different values is a one-line error."""
    extra = list(overrides)
    if steps is not None:
        extra.append(f"train.steps={steps}")
    if budget_minutes is not None:
        extra.append(f"train.budget_minutes={budget_minutes}")
    check_repeated_keys(extra)
    return extra


def _summary(result: Any) -> dict[str, Any]:
    """The JSON-able outcome of a training run."""
    return {
        "out": str(result.out_dir),
        "step": result.step,
        "stopped": result.stopped,
        "resumed_from": result.resumed_from,
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        **result.counts,
        "precision": result.precision,
        "elapsed_s": round(result.elapsed_s, 2),
        "final_loss": result.losses[-1] if result.losses else None,
        "last_eval": result.last_eval,
    }


def _train(
    arch: str,
    config_data: dict[str, Any],
    overrides: list[str],
    task: str | None,
    out: str | None,
    steps: int | None,
    budget_minutes: float | None,
    progress: bool,
    log: Callable[[str], None] | None,
    stop_at: int | None = None,
    on_pace: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    from latentloop.families import family
    from latentloop.train.loop import train as run_training

    extra = _budget_overrides(overrides, steps, budget_minutes)
    config = family(arch).build_config(config_data, extra, task=task, arch=arch)
    out_dir = Path(out) if out else Path("runs") / f"{config.task.name}-{config.arch}"
    result = run_training(config, out_dir, progress=progress, log=log, stop_at=stop_at, on_pace=on_pace)
    return _summary(result)


def _split_arguments(args: list[str], config: str | None) -> tuple[str | None, list[str]]:
    """Positional arguments are ``key=value`` overrides, except one YAML file (``latentloop train CONFIG``)."""
    overrides = []
    for arg in args:
        if "=" in arg:
            overrides.append(arg)
        elif arg.endswith((".yaml", ".yml")) and config is None:
            config = arg
        else:
            raise UsageError(f"argument {arg!r} is neither key=value nor a .yaml config file")
    return config, overrides


@app.command()
def train(
    args: list[str] = typer.Argument(None, help="key=value overrides (e.g. model.n_embd=128 train.lr=1e-3)."),
    config: str = typer.Option(None, "--config", "-c", help="YAML run config (model, train, task sections)."),
    task: str = typer.Option(
        None, "--task", help="Task name, with options: arithmetic or arithmetic:digits=4."
    ),
    model: str = typer.Option(
        None, "--model", help="Model family (default: the config's arch or recurrent-depth)."
    ),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps in all (overrides train.steps)."),
    budget_minutes: float = typer.Option(None, "--budget-minutes", help="Stop after this much wall time."),
    stop_at: int = typer.Option(
        None,
        "--stop-at",
        help="End this call after step N with a checkpoint; the schedule stays train.steps.",
    ),
    out: str = typer.Option(None, "--out", "-o", help="Run folder (default runs/TASK-MODEL)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or log lines."),
) -> None:
    """Train a model; resumes automatically from the run folder's newest checkpoint.

    Under ``torchrun --nproc_per_node=N -m latentloop train ...`` it trains data-parallel over N processes.
    """
    from latentloop.config import load_yaml
    from latentloop.families import family
    from latentloop.train.distributed import env_rank
    from latentloop.train.loop import TrainingError
    from latentloop.train.run_config import LM_ARCH

    config, overrides = _split_arguments(list(args or []), config)
    data = load_yaml(config) if config else {}
    arch = model or str(data.get("arch") or LM_ARCH)
    family(arch)  # an unknown model fails before anything is read
    if stop_at is not None and stop_at < 0:
        raise UsageError(f"--stop-at must not be negative, got {stop_at}")
    interactive = sys.stderr.isatty()

    def log(line: str) -> None:
        typer.echo(line, err=True)

    def announce(seconds: float) -> None:  # beside the progress bar, which shows no log lines
        typer.echo(f"training takes about {seconds / 60:.1f} min on this machine", err=True)

    try:
        result = _train(
            arch,
            data,
            overrides,
            task,
            out,
            steps,
            budget_minutes,
            progress=interactive and not quiet,
            log=None if quiet or interactive else log,
            stop_at=stop_at,
            on_pace=announce if interactive and not quiet else None,
        )
    except TrainingError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    if env_rank() != 0:  # every rank has the same result; rank 0 reports it
        return
    if json_output:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"trained {result['out']} to step {result['step']} (stopped by {result['stopped']})")
    if result["final_loss"] is not None:
        typer.echo(
            f"final loss {result['final_loss']:.4f}, {result['tokens_seen']} tokens, {result['precision']}"
        )
    if result["last_eval"]:
        ev = result["last_eval"]
        metric = "exact_match" if "exact_match" in ev else "perplexity"
        typer.echo(f"held-out {metric} at depth {ev['num_steps']}: {ev[metric]:.4f}")
    typer.echo(f"checkpoint: {result['checkpoint']}")


_GRIDS = ("steps_grid", "samples_grid", "width_depths")


def _puzzle(default: Any, help: str) -> Any:
    return option(default, f"Puzzle models: {help}")


@dataclass
class PuzzleEvalOptions:
    """The options of ``latentloop eval`` that puzzle models take (:func:`evaluate_reasoner`'s settings)."""

    samples: int | None = _puzzle(None, "parallel samples per puzzle (default 20).")
    steps: int | None = _puzzle(None, "supervision steps (default: n_sup).")
    select: str = _puzzle("vote", "vote, value, first or q (the halting head).")
    seed: int = _puzzle(0, "seed of the sampling noise.")
    halt: bool = _puzzle(False, "a sample keeps its answer from the step its Q-head halts at.")
    split: str = _puzzle("test", "test, or validation (the training puzzles held out by train.validation).")
    steps_grid: str | None = _puzzle(
        None, "depths of the compute table's depth curve, one trajectory each (1,2,4,...,320)."
    )
    samples_grid: str | None = _puzzle(None, "samples of the width curves (1,2,5,10,20).")
    width_depths: str | None = _puzzle(None, "the steps at which the width curves are measured (4,8,16).")
    state_noise: float = _puzzle(
        0.0,
        "for the width curves of a deterministic model, Gaussian noise of this standard deviation added to its "
        "latent state before every step (noisy TRM; rank with --select q).",
    )
    timing_puzzles: int = _puzzle(8, "puzzles solved one at a time to time each compute cell.")


@app.command("eval")
@with_options(options_of(PuzzleEvalOptions))
def eval_command(
    run: str = typer.Argument(
        ...,
        help="Run folder (its newest checkpoint), checkpoint folder, or Hub model id org/name (then the "
        "reports are printed, not written into the Hugging Face cache).",
    ),
    revision: str = REVISION,
    depths: str = typer.Option(
        None, "--depths", help="Language models: comma-separated test-time depths (default 1,2,4,8,16,32)."
    ),
    num_steps: str = typer.Option(None, "--num-steps", hidden=True, help="Deprecated spelling of --depths."),
    task: str = typer.Option(
        None,
        "--task",
        help="Task spec: needed for a checkpoint outside a run; for the run's own task it changes only the "
        "options given (chains:test_hops=9-12).",
    ),
    batch_size: int = typer.Option(256, "--batch-size", help="Held-out problems per forward pass."),
    limit: int = typer.Option(None, "--limit", help="Evaluate only the first N held-out problems/windows."),
    init_scale: float = typer.Option(
        0.0, "--init-scale", help="Initial latent state scale (0 = deterministic)."
    ),
    num_samples: int = typer.Option(
        1,
        "--num-samples",
        min=1,
        help="Language models: latent trajectories per problem, answered by vote (needs --init-scale > 0).",
    ),
    temperature: float = TEMPERATURE,
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    **puzzle: Any,
) -> None:
    """Held-out accuracy (or perplexity) at each test-time depth; writes eval.json, eval.md, eval_depth.png.
    Puzzle models: accuracy by the verifier, coverage, conflicts, curves over steps and samples; with
    --steps-grid or --width-depths also accuracy, inference FLOPs and ms per puzzle of every cell
    (eval_compute.png)."""
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be positive, got {limit}")
    options = PuzzleEvalOptions(**puzzle)
    if options.split not in ("test", "validation"):
        raise UsageError(f"--split must be test or validation, got {options.split!r}")
    if num_steps is not None:
        deprecated("--num-steps", "--depths")
        depths = num_steps if depths is None else depths
    depth_list = int_list("1,2,4,8,16,32" if depths is None else depths, "--depths")
    from latentloop.families import REASONER, family_of_run
    from latentloop.hub import from_hub, resolve_model

    write = not from_hub(run)
    run = str(resolve_model(run, revision))
    shared = {"batch_size": batch_size, "limit": limit, "task": task, "write": write}
    if family_of_run(run) is REASONER:
        report, text = _eval_reasoner(run, options, temperature, **shared)
    else:
        if options.samples is not None:  # its meaning for language models before --num-samples
            deprecated("--samples", "--num-samples")
            num_samples = options.samples
        if options.split != "test":
            raise UsageError(
                "--split is for puzzle models; a language model is evaluated on its held-out text"
            )
        from latentloop.eval.lm import evaluate_lm, markdown_table

        report = evaluate_lm(run, depth_list, init_scale=init_scale, samples=num_samples, **shared)
        text = markdown_table(report).rstrip()
    if json_output:
        typer.echo(json.dumps(report))
        return
    typer.echo(text)
    for path in report.get("written", []):
        typer.echo(f"wrote {path}")


def _eval_reasoner(
    run: str, options: PuzzleEvalOptions, temperature: float, **shared: Any
) -> tuple[dict[str, Any], str]:
    """``latentloop eval`` of a puzzle model: the report and its table."""
    from latentloop.eval.grid import ComputeGrid
    from latentloop.eval.reasoners import evaluate_reasoner, markdown_table

    if options.samples is not None and options.samples < 1:
        raise UsageError(f"--samples must be at least 1, got {options.samples}")
    grids = [int_list(getattr(options, name), f"--{name.replace('_', '-')}") for name in _GRIDS]
    report = evaluate_reasoner(
        run,
        samples=20 if options.samples is None else options.samples,
        steps=options.steps,
        select=options.select,
        temperature=temperature,
        seed=options.seed,
        halt=options.halt,
        split=options.split,
        grid=ComputeGrid(*grids, options.state_noise, options.timing_puzzles),
        **shared,
    )
    return report, markdown_table(report).rstrip()


@app.command("fit-value")
def fit_value_command(
    run: str = typer.Argument(..., help="GRAM run folder (its newest checkpoint) or checkpoint folder."),
    rollouts: int = typer.Option(12288, "--rollouts", help="Training puzzles rolled out from the prior."),
    steps: int = typer.Option(1000, "--steps", help="Updates of the value head."),
    batch_size: int = typer.Option(
        128, "--batch-size", help="Latents per update (one per supervision step of a rollout)."
    ),
    lr: float = typer.Option(1e-3, "--lr", help="AdamW learning rate of the value head."),
    held_out: int = typer.Option(512, "--held-out", help="Fresh rollouts that measure the fitted head."),
    temperature: float = TEMPERATURE,
    seed: int = typer.Option(0, "--seed", help="Seed of the puzzles drawn and the sampling noise."),
    memory_gib: float = typer.Option(
        8.0, "--memory-gib", help="Most latents held at once (GiB); more rollouts are fitted in rounds."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Fit GRAM's value head (LPRM) to the model's own samples: each step of its prior rollouts of training
    puzzles, labelled by the task's verifier. Writes value_head.safetensors into the checkpoint, which eval,
    solve and `--select value` then use."""
    from latentloop.families import REASONER, family_of_run
    from latentloop.hub import from_hub

    if from_hub(run):  # the fitted head is written into the checkpoint, never into the Hugging Face cache
        raise UsageError(f"{run} does not exist (fit-value writes into a local run or checkpoint folder)")
    if family_of_run(run) is not REASONER:
        raise UsageError(f"{run} is not a puzzle-reasoner run: fit-value fits the value head of GRAM")
    from latentloop.experiments import positive_number
    from latentloop.infer.runs import load_run, run_dataset
    from latentloop.train.value import fit_value_head, save_value_head

    model, task, checkpoint, folder = load_run(run)
    split = run_dataset(run, folder).split("train")
    head, summary = fit_value_head(
        model,
        task,
        split,
        rollouts,
        steps,
        batch_size,
        lr,
        seed,
        held_out,
        temperature,
        progress=None,
        max_memory_gib=positive_number(memory_gib, "--memory-gib"),
    )
    summary["file"] = str(save_value_head(head, checkpoint, summary))
    if json_output:
        typer.echo(json.dumps(summary))
        return

    def auc(value: float | None) -> str:
        return "n/a (one class only)" if value is None else f"{value:.3f}"

    rounds = f", in {summary['rounds']} rounds" if summary["rounds"] > 1 else ""
    typer.echo(
        f"fitted on {summary['rollouts']} rollouts ({summary['examples']} latents{rounds}), {summary['steps']} "
        f"updates in {summary['seconds']} s; final loss {summary['loss']:.4f}"
    )
    typer.echo(
        f"{summary['held_out_rollouts']} fresh rollouts, {summary['held_out_valid']:.1%} valid at the last step; "
        f"ROC AUC there {auc(summary['held_out_auc'])} (the model's current value head: "
        f"{auc(summary['current_head_auc'])})"
    )
    typer.echo(f"wrote {summary['file']}")
