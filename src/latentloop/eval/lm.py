"""Held-out evaluation of a recurrent-depth LM at several test-time depths.

- Arithmetic (``exact_match``): a problem counts as solved when greedy decoding reproduces its answer and the
  task's verifier accepts it. Under teacher forcing the argmax at every answer position equals the target
  exactly when greedy decoding would emit the target token by token (each step then sees the same prefix), so
  one batched forward pass per depth decides all problems.
- Text (``perplexity``): ``exp`` of the mean next-token negative log-likelihood over the held-out tail.

Every forward starts from a zero latent state (``init_scale=0``), so results are deterministic and repeatable;
pass another ``init_scale`` to evaluate from the random initial state used in training (then the torch RNG,
seeded with 0 at the start, decides the draw). ``samples=K`` (with ``init_scale > 0``) spends width instead
of depth: K latent trajectories per problem, answered by majority vote.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from latentloop.errors import UsageError
from latentloop.eval.metrics import heldout_metric
from latentloop.io import atomic_write_text
from latentloop.models.looped_lms import load_looped_lm
from latentloop.plotting import pyplot, save_png
from latentloop.tasks.base import Task, get_task, parse_task_spec
from latentloop.train.checkpoint import read_trainer_state, resolve_checkpoint, run_folder_of
from latentloop.train.run_config import load_run_config

DEFAULT_DEPTHS = (1, 2, 4, 8, 16, 32)


def evaluation_task(
    checkpoint: Path, task_spec: str | None, task_options: dict[str, Any] | None = None
) -> tuple[Task, dict[str, Any]]:
    """The task to evaluate on: the run's own, with the options of ``task_spec`` (when it names the same
    task) and ``task_options`` laid over the run's; a spec naming another task replaces it."""
    run = run_folder_of(checkpoint)
    name, options = None, {}
    if run is not None:
        config = load_run_config(run / "config.yaml")
        name, options = config.task.name, dict(config.task.options)
    if task_spec:
        spec_name, spec_options = parse_task_spec(task_spec)
        options = {**options, **spec_options} if spec_name == name else spec_options
        name = spec_name
    if name is None:
        raise UsageError(f"{checkpoint} is not inside a run folder; say which task to evaluate with --task")
    options.update(task_options or {})
    return get_task(name, **options), {"name": name, **options}


def evaluate_lm(
    run_or_checkpoint: str | Path,
    depths: Sequence[int] = DEFAULT_DEPTHS,
    batch_size: int = 256,
    limit: int | None = None,
    init_scale: float = 0.0,
    task: str | None = None,
    write: bool = True,
    device: str = "cpu",
    samples: int = 1,
    task_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate a run folder (its newest checkpoint) or a checkpoint folder at each depth in ``depths``.

    Returns ``{"checkpoint", "step", "task", "metric", "init_scale", "results": [{"num_steps", <metric>, ...}]}``
    and, when ``write``, saves ``eval.json``, ``eval.md`` and ``eval_depth.png`` into the run folder (or the
    checkpoint folder when it is not part of a run). ``task`` (e.g. ``"arithmetic:digits=3"``) is needed only
    for a checkpoint outside a run folder; inside one, a spec of the run's own task (or ``task_options``)
    changes only the options it names, e.g. ``"chains:test_hops=9-12"`` for a harder held-out tier.
    ``samples=K > 1`` scores the majority answer of K latent trajectories (needs ``init_scale > 0``).
    """
    depths = [int(d) for d in depths]
    if not depths or min(depths) < 1:
        raise UsageError(f"depths must be positive integers, got {depths}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise UsageError(f"samples must be a whole number of at least 1, got {samples!r}")
    if samples > 1 and init_scale <= 0:
        raise UsageError(
            "samples > 1 needs --init-scale > 0: trajectories from the zero state are all the same"
        )
    if batch_size < 1:
        raise UsageError(f"batch size must be positive, got {batch_size}")
    checkpoint = resolve_checkpoint(run_or_checkpoint)
    the_task, task_info = evaluation_task(checkpoint, task, task_options)
    if samples > 1 and the_task.metric != "exact_match":
        raise UsageError(
            f"samples > 1 votes over answers; task {task_info['name']!r} has no answers to vote on"
        )
    model = load_looped_lm(checkpoint, device=device)
    if model.config.vocab_size < the_task.vocab_size:
        raise UsageError(
            f"{checkpoint}: vocabulary {model.config.vocab_size} is smaller than the task's {the_task.vocab_size}"
        )
    step = None
    if (checkpoint / "trainer_state.json").is_file():
        step = read_trainer_state(checkpoint)["step"]
    if init_scale:
        torch.manual_seed(0)
    results = []
    for depth in depths:
        results.append(
            {
                "num_steps": depth,
                **heldout_metric(model, the_task, depth, batch_size, limit, init_scale, samples),
            }
        )
    report = {
        "checkpoint": str(checkpoint),
        "step": step,
        "task": task_info,
        "metric": the_task.metric,
        "init_scale": init_scale,
        "samples": samples,
        "results": results,
    }
    if write:
        folder = run_folder_of(checkpoint) or checkpoint
        write_reports(report, folder)
        report["written"] = [str(folder / n) for n in ("eval.json", "eval.md", "eval_depth.png")]
    return report


def markdown_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table, one row per depth."""
    metric = report["metric"]
    lines = [
        f"# Evaluation of `{report['checkpoint']}`",
        "",
        f"Task `{report['task'].get('name')}`, step {report['step']}, initial state scale {report['init_scale']}.",
        "",
    ]
    if metric == "exact_match" and report.get("samples", 1) > 1:
        lines[-2] += f" {report['samples']} latent trajectories per problem, answered by majority vote."
        lines += [
            "| depth (num_steps) | exact match, vote | one trajectory | any trajectory | problems |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['num_steps']} | {r['exact_match']:.2%} | {r['single']:.2%} | {r['any']:.2%} | {r['n']} |"
            for r in report["results"]
        ]
    elif metric == "exact_match" and all("prefix_accuracy" in r for r in report["results"]):
        lines += [
            "| depth (num_steps) | exact match | prompt positions right (prefix labels) | problems |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['num_steps']} | {r['exact_match']:.2%} | {r['prefix_accuracy']:.2%} | {r['n']} |"
            for r in report["results"]
        ]
    elif metric == "exact_match":
        lines += ["| depth (num_steps) | exact match | problems |", "|---:|---:|---:|"]
        lines += [f"| {r['num_steps']} | {r['exact_match']:.2%} | {r['n']} |" for r in report["results"]]
    else:
        lines += ["| depth (num_steps) | perplexity | loss (nats/token) | tokens |", "|---:|---:|---:|---:|"]
        lines += [
            f"| {r['num_steps']} | {r['perplexity']:.3f} | {r['loss']:.4f} | {r['tokens']} |"
            for r in report["results"]
        ]
    return "\n".join(lines) + "\n"


def plot_depth(report: dict[str, Any], path: Path) -> None:
    """``metric`` against depth (log2 axis) as a PNG."""
    plt = pyplot()

    metric = report["metric"]
    xs = [r["num_steps"] for r in report["results"]]
    ys = [r[metric] * (100 if metric == "exact_match" else 1) for r in report["results"]]
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    ax.plot(xs, ys, marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("recurrence depth at test time (num_steps)")
    ax.set_ylabel("exact match (%)" if metric == "exact_match" else "perplexity")
    ax.set_title(f"{report['task'].get('name')}: held-out {metric.replace('_', ' ')} vs depth")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)


def write_reports(report: dict[str, Any], folder: str | Path) -> None:
    """``eval.json``, ``eval.md`` and ``eval_depth.png`` in ``folder``."""
    folder = Path(folder)
    atomic_write_text(folder / "eval.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(folder / "eval.md", markdown_table(report))
    plot_depth(report, folder / "eval_depth.png")
