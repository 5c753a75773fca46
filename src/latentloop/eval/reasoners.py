"""Evaluation of puzzle reasoners: accuracy by the task's verifier, coverage, conflicts, depth/width curves.

Every decoded answer is judged by ``task.violations`` (0 = valid), never by comparison with one stored label, so
a valid N-Queens board that differs from the label counts (the judging functions are in
:mod:`latentloop.eval.metrics`, re-exported here). Coverage (``task.multi_solution``) is the number of
distinct valid answers among the samples divided by the number of all valid completions of the puzzle.
Reports go to ``eval.json``, ``eval.md`` and ``eval_curves.png`` in the run folder.

A :class:`ComputeGrid` adds the test-time compute of every (steps, samples, selection) cell it asks for:
accuracy, inference FLOPs per puzzle (counted from shapes, :func:`~latentloop.infer.scaling.inference_flops`)
and wall-clock milliseconds per puzzle, drawn as accuracy against FLOPs (``eval_compute.png``) as in GRAM's
Figure 4.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from latentloop.errors import UsageError
from latentloop.eval.arc import evaluate_arc
from latentloop.eval.gap import prior_posterior_gap
from latentloop.eval.grid import ComputeGrid
from latentloop.eval.metrics import (
    EXAMPLES,
    answer_key,
    answers_valid,
    chosen_samples,
    conflict_counts,
    coverage_curve,
    decode_answer,
    example_answers,
    judge,
    quick_accuracy,
    roc_auc,
    solution_totals,
    unique_puzzles,
    unique_rows,
)
from latentloop.infer.runs import load_run, run_dataset
from latentloop.infer.scaling import (
    SELECTIONS,
    draws_samples,
    inference_flops,
    solve,
    step_cost,
    trajectories,
)
from latentloop.io import atomic_write_text
from latentloop.models.reasoners import Reasoner, num_parameters
from latentloop.models.reasoners.heads import SequenceValueHead
from latentloop.plotting import pyplot, save_png
from latentloop.tasks.base import Task

# The judging functions of eval.metrics are re-exported for the modules that import them from here.
__all__ = [
    "EXAMPLES",
    "ComputeGrid",
    "answer_key",
    "answers_valid",
    "compute_table",
    "decode_answer",
    "evaluate_grid",
    "evaluate_model",
    "evaluate_reasoner",
    "example_answers",
    "markdown_table",
    "plot_boards",
    "plot_compute",
    "plot_curves",
    "quick_accuracy",
    "unique_puzzles",
    "unique_rows",
    "write_reports",
]


@torch.no_grad()
def evaluate_model(
    model: Reasoner,
    task: Task,
    inputs: np.ndarray,
    samples: int = 20,
    steps: int | None = None,
    select: str = "vote",
    batch_size: int = 256,
    halt: bool = False,
    temperature: float = 1.0,
    progress: bool | None = None,
    label: str = "evaluating",
) -> dict[str, Any]:
    """Accuracy (and coverage, conflicts) of ``model`` on puzzle ``inputs`` ``[N, L]`` with curves over steps
    ``1..steps`` (all samples, ``select``) and over samples ``1..samples`` (last step, every selection).
    ``steps`` defaults to the model's own (see :func:`solve`); ``temperature`` is the AR/MDLM samplers' and
    scales GRAM's prior noise.
    ``progress`` shows a bar named ``label`` on stderr (default: when stderr is a terminal)."""
    if select not in SELECTIONS:
        raise UsageError(f"--select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    rollout = _rollout(model, inputs, samples, steps, batch_size, halt, temperature, 0.0, progress, label)
    predictions, values, halt_logits = rollout["predictions"], rollout["values"], rollout["halt_logits"]
    halted_at = rollout["halted_at"]  # [K, N]: the step whose answer each sample kept
    steps = predictions.shape[0]
    violations, key_ids, puzzles = judge(task, inputs, predictions)
    valid = violations == 0
    count = len(inputs)
    idx = np.arange(count)

    def accuracy_at(s: int, k: int, mode: str) -> float:
        scores = halt_logits if mode == "q" else values
        chosen = chosen_samples(key_ids[s, :k], scores[s, :k], mode)
        return float(valid[s, chosen, idx].mean())

    report: dict[str, Any] = {
        "task": task.name,
        "parameters": num_parameters(model),
        "puzzles": count,
        "samples": samples,
        "steps": steps,
        "select": select,
        "accuracy": accuracy_at(steps - 1, samples, select),
        "accuracy_by_select": {m: accuracy_at(steps - 1, samples, m) for m in SELECTIONS},
        "oracle_accuracy": float(valid[-1].any(axis=0).mean()),
        "curve_steps": [{"steps": s + 1, "accuracy": accuracy_at(s, samples, select)} for s in range(steps)],
        "curve_samples": [
            {"samples": k, **{m: accuracy_at(steps - 1, k, m) for m in ("vote", "value")}}
            for k in range(1, samples + 1)
        ],
    }
    cost = step_cost(model)
    if cost is not None:
        runs = trajectories(model, samples)
        report["inference_flops"] = {"step": cost.step, "value_head": cost.value_head, "trajectories": runs}
        report["flops_per_puzzle"] = inference_flops(cost, steps, runs, select)
    if draws_samples(model):
        report["temperature"] = temperature
        # How well the value head ranks the samples the verifier accepts above the others, at the last step
        report["value_auc"] = roc_auc(values[-1].ravel(), valid[-1].ravel())
    if halt:
        report["halt"] = True
        report["mean_halt_step"] = float(halted_at.mean())
    chosen = chosen_samples(key_ids[-1], values[-1], select)
    if task.reports_conflicts:
        report.update(conflict_counts(violations[-1], chosen))
    totals = None
    if task.multi_solution:
        totals = solution_totals(task, puzzles)
        coverage = coverage_curve(key_ids[-1], valid[-1], totals)
        report["coverage"] = coverage[-1]
        for point, cov in zip(report["curve_samples"], coverage, strict=True):
            point["coverage"] = cov
    report["examples"] = example_answers(inputs, predictions[-1], violations[-1], key_ids[-1], chosen, totals)
    return report


def _rollout(
    model: Reasoner,
    inputs: np.ndarray,
    samples: int,
    steps: int | None,
    batch_size: int,
    halt: bool,
    temperature: float,
    state_noise: float,
    progress: bool | None,
    label: str,
) -> dict[str, np.ndarray]:
    """Every step's answers ``[S, K, N, L]``, values and halting logits ``[S, K, N]`` of ``samples``
    trajectories on ``inputs``, in chunks of about ``batch_size`` rows; ``halted_at`` ``[K, N]``."""
    per_sample = max(1, batch_size // samples) if draws_samples(model, state_noise) else batch_size
    preds, vals, logits, halts = [], [], [], []
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=len(inputs), desc=label, unit="puzzle", disable=not show, leave=False) as bar:
        for start in range(0, len(inputs), per_sample):
            x = torch.from_numpy(inputs[start : start + per_sample])
            result = solve(
                model,
                x,
                steps=steps,
                samples=samples,
                select="first",
                halt=halt,
                temperature=temperature,
                state_noise=state_noise,
            )
            preds.append(result.predictions.numpy().astype(np.uint8))
            vals.append(result.values.numpy())
            # sigmoid keeps the order of the logits: what q selects is the same
            logits.append((result.halt_prob if result.halt_logits is None else result.halt_logits).numpy())
            halts.append(result.halted_at.numpy())
            bar.update(len(x))
    return {
        "predictions": np.concatenate(preds, axis=2),
        "values": np.concatenate(vals, axis=2),
        "halt_logits": np.concatenate(logits, axis=2),
        "halted_at": np.concatenate(halts, axis=1),
    }


# Test-time compute ---------------------------------------------------------------------------------------------
WIDTH_SELECTIONS = ("vote", "value", "q")  # the selections a width cell is measured under


def evaluate_grid(
    model: Reasoner,
    task: Task,
    inputs: np.ndarray,
    grid: ComputeGrid,
    batch_size: int = 256,
    temperature: float = 1.0,
    progress: bool | None = None,
    label: str = "evaluating",
) -> dict[str, Any] | None:
    """Accuracy, inference FLOPs per puzzle and milliseconds per puzzle of every cell of ``grid`` on puzzle
    ``inputs`` ``[N, L]``; ``None`` for a generative baseline (its sampler has no supervision steps).

    The FLOPs of a cell are ``runs · steps · step + runs · value_head`` (the last term under value selection
    only), with the step's and the value head's forward FLOPs on one puzzle counted from shapes
    (:func:`~latentloop.infer.scaling.step_cost`) and ``runs`` the trajectories run. The time of a cell is
    the wall-clock of its steps when the first ``grid.timing_puzzles`` puzzles are solved one at a time,
    averaged (selecting among the samples is left out)."""
    cost = step_cost(model)
    if cost is None or not grid.active:
        return None
    widths = draws_samples(model, grid.state_noise) and bool(grid.width_depths)
    noise = 0.0 if model.stochastic else grid.state_noise  # GRAM brings its own noise
    cells: list[dict[str, Any]] = []
    if grid.steps_grid:
        # The depth curve of one trajectory: the deterministic model itself, without the noise of the widths.
        rollout = _rollout(
            model, inputs, 1, max(grid.steps_grid), batch_size, False, temperature, 0.0, progress, label
        )
        kept = rollout["predictions"][[s - 1 for s in grid.steps_grid]]
        violations, _, _ = judge(task, inputs, kept)
        for row, s in enumerate(grid.steps_grid):
            cells.append(
                {
                    "curve": "depth",
                    "steps": s,
                    "samples": 1,
                    "select": "first",
                    "accuracy": float((violations[row, 0] == 0).mean()),
                    "flops": inference_flops(cost, s, 1, "first"),
                }
            )
    if widths:
        cells += _width_cells(
            model, task, inputs, grid, cost, batch_size, temperature, noise, progress, label
        )
    times = _time_cells(model, inputs[: grid.timing_puzzles], grid, widths, noise, temperature)
    for cell in cells:
        cell["ms_per_puzzle"] = times.get((cell["curve"], cell["steps"], cell["samples"]))
    return {
        "settings": asdict(grid),
        "step_flops": cost.step,
        "value_head_flops": cost.value_head,
        "state_noise": noise,
        "cells": cells,
    }


def _width_cells(
    model: Reasoner,
    task: Task,
    inputs: np.ndarray,
    grid: ComputeGrid,
    cost: Any,
    batch_size: int,
    temperature: float,
    noise: float,
    progress: bool | None,
    label: str,
) -> list[dict[str, Any]]:
    """The width cells of :func:`evaluate_grid`: each depth of ``grid.width_depths`` by each sample count of
    ``grid.samples_grid`` and each selection, from one rollout of the most samples to the deepest step."""
    samples, depth = max(grid.samples_grid), max(grid.width_depths)
    rollout = _rollout(model, inputs, samples, depth, batch_size, False, temperature, noise, progress, label)
    at = [d - 1 for d in grid.width_depths]
    violations, key_ids, _ = judge(task, inputs, rollout["predictions"][at])
    scores = {"value": rollout["values"][at], "q": rollout["halt_logits"][at]}
    idx = np.arange(len(inputs))
    cells = []
    for row, d in enumerate(grid.width_depths):
        for k in grid.samples_grid:
            for mode in WIDTH_SELECTIONS:
                chosen = chosen_samples(key_ids[row, :k], scores.get(mode, scores["value"])[row, :k], mode)
                accuracy = float((violations[row, chosen, idx] == 0).mean())
                cells.append(
                    {"curve": "width", "steps": d, "samples": k, "select": mode, "accuracy": accuracy}
                    | {"flops": inference_flops(cost, d, k, mode)}
                )
    return cells


@torch.no_grad()
def _time_cells(
    model: Reasoner, puzzles: np.ndarray, grid: ComputeGrid, widths: bool, noise: float, temperature: float
) -> dict[tuple[str, int, int], float]:
    """Milliseconds per puzzle of each (curve, steps, samples) cell: each puzzle solved alone, the clock read
    after every supervision step (a forward hook), so one run to the deepest cell times every shallower one.
    The RNG state is kept: timing draws none of the evaluation's noise."""
    runs: list[tuple[str, int, list[int], float]] = []  # (curve, samples, depths, state noise)
    if grid.steps_grid:
        runs.append(("depth", 1, grid.steps_grid, 0.0))
    if widths:
        runs += [("width", k, grid.width_depths, noise) for k in grid.samples_grid]
    if len(puzzles) == 0 or not runs:
        return {}
    stamps: list[float] = []
    handle = model.register_forward_hook(lambda *_: stamps.append(time.perf_counter()))
    times: dict[tuple[str, int, int], float] = {}
    try:
        with torch.random.fork_rng(devices=[]):
            x = torch.from_numpy(puzzles[:1]).long()
            solve(model, x, steps=1, temperature=temperature)  # warm-up: first-call allocations
            for curve, samples, depths, sigma in runs:
                totals = np.zeros(len(depths))
                for puzzle in puzzles:
                    x = torch.from_numpy(puzzle[None]).long()
                    stamps.clear()
                    start = time.perf_counter()
                    solve(
                        model,
                        x,
                        steps=max(depths),
                        samples=samples,
                        temperature=temperature,
                        state_noise=sigma,
                    )
                    totals += [stamps[d - 1] - start for d in depths]
                for d, total in zip(depths, totals, strict=True):
                    times[(curve, d, samples)] = 1000 * total / len(puzzles)
    finally:
        handle.remove()
    return times


def evaluate_reasoner(
    run: str | Path,
    samples: int = 20,
    steps: int | None = None,
    select: str = "vote",
    batch_size: int = 256,
    limit: int | None = None,
    task: str | None = None,
    write: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    progress: bool | None = None,
    label: str = "evaluating",
    halt: bool = False,
    split: str = "test",
    grid: ComputeGrid | None = None,
    **_: Any,
) -> dict[str, Any]:
    """Evaluate a run's newest checkpoint on its test split (or ``split``: ``validation``, the training
    puzzles a run with ``train.validation`` held out); writes the reports into the run folder.
    ``temperature`` is the sampling temperature of the AR and MDLM baselines (0: greedy) and the scale of GRAM's
    prior noise (0: the prior's mean); ``seed`` seeds the models' sampling noise, so the same call gives the
    same report (the caller's RNG state is kept). ``halt``: each sample keeps the answer of the step at which
    its Q-head halts (see :func:`~latentloop.infer.scaling.solve`). ``grid``: the test-time compute cells
    measured after the evaluation (:func:`evaluate_grid`), reported under ``compute``.
    ``progress`` and ``label``: the progress bar of :func:`evaluate_model`."""
    if samples < 1 or (steps is not None and steps < 1):
        raise UsageError("--samples and --steps must be at least 1")
    with torch.random.fork_rng(devices=[]):  # building the model draws (discarded) initial weights too
        model, the_task, checkpoint, folder = load_run(run, task)
        dataset = run_dataset(run, folder)
        torch.manual_seed(seed)
        if model.config.puzzles:
            if halt:
                raise UsageError("--halt is not available for ARC runs: they are evaluated at a fixed depth")
            if grid is not None and grid.active:
                raise UsageError(
                    "the compute grid is not available for ARC runs: they score pass@2 over copies"
                )
            puzzles = dataset.metadata.get("puzzles", {})
            report = evaluate_arc(
                model, the_task, dataset.split(split), puzzles, samples, steps, select, batch_size, limit
            )
        else:
            inputs = unique_puzzles(dataset.split(split), limit)
            report = evaluate_model(
                model,
                the_task,
                inputs,
                samples,
                steps,
                select,
                batch_size,
                temperature=temperature,
                progress=progress,
                label=label,
                halt=halt,
            )
            compute = None
            if grid is not None and grid.active:
                compute = evaluate_grid(
                    model, the_task, inputs, grid, batch_size, temperature, progress, label
                )
            if compute is not None:
                report["compute"] = compute
            if model.has_posterior:  # GRAM: what its prior has learned of what its posterior knows
                report["gap"] = prior_posterior_gap(model, the_task, dataset.split("train"), seed=seed)
    report = {"run": str(run), "checkpoint": str(checkpoint), "model": model.arch, "seed": seed, **report}
    if split != "test":
        report["split"] = split
    # Which value head ranked the samples: the one trained with the model, or one fitted to its samples.
    report["value_head"] = "fitted" if isinstance(model.value_head, SequenceValueHead) else "trained"
    if write:
        out = folder if folder is not None else checkpoint
        write_reports(report, out, the_task)
        names = ["eval.json", "eval.md", "eval_curves.png", "eval_compute.png"] + (
            ["eval_boards.png"] if the_task.drawable else []
        )
        report["written"] = [str(out / n) for n in names if (out / n).is_file()]
    return report


# Reports -----------------------------------------------------------------------------------------------------
def markdown_table(report: dict[str, Any]) -> str:
    """The headline numbers and the curves as Markdown."""
    lines = [
        f"# {report.get('model', '?')} on {report['task']} ({report['puzzles']} {report.get('split', 'test')} puzzles, "
        f"{report['parameters']:,} parameters)",
        "",
        "| metric | value |",
        "|---|---|",
        f"| accuracy ({report['select']}, {report['samples']} samples, {report['steps']} steps) | "
        f"{100 * report['accuracy']:.1f}% |",
    ]
    if report.get("halt"):
        lines.append(f"| samples halted by the Q-head, at step (mean) | {report['mean_halt_step']:.2f} |")
    for mode, value in report["accuracy_by_select"].items():
        head = f" ({report['value_head']} value head)" if mode == "value" and "value_head" in report else ""
        lines.append(f"| accuracy, select {mode}{head} | {100 * value:.1f}% |")
    lines.append(f"| any sample valid (oracle) | {100 * report['oracle_accuracy']:.1f}% |")
    if report.get("value_auc") is not None:
        lines.append(
            f"| value head ROC AUC (valid samples above the others, last step) | {report['value_auc']:.3f} |"
        )
    if "coverage" in report:
        lines.append(f"| coverage ({report['samples']} samples) | {100 * report['coverage']:.1f}% |")
    if "conflicts_total" in report:
        lines.append(
            f"| conflicts (total / mean per graph) | {report['conflicts_total']} / {report['conflicts_mean']:.2f} |"
        )
    lines += ["", "| steps | accuracy |", "|---|---|"]
    lines += [f"| {p['steps']} | {100 * p['accuracy']:.1f}% |" for p in report["curve_steps"]]
    has_cov = "coverage" in report
    lines += [
        "",
        "| samples | vote | value |" + (" coverage |" if has_cov else ""),
        "|---|---|---|" + ("---|" if has_cov else ""),
    ]
    for p in report["curve_samples"]:
        row = f"| {p['samples']} | {100 * p['vote']:.1f}% | {100 * p['value']:.1f}% |"
        lines.append(row + (f" {100 * p['coverage']:.1f}% |" if has_cov else ""))
    if "gap" in report:
        gap = report["gap"]
        lines += [
            "",
            f"On {gap['puzzles']} training puzzles, {gap['steps']} steps, one sample: prior "
            f"{100 * gap['prior_valid']:.1f}%, posterior {100 * gap['posterior_valid']:.1f}% (gap "
            f"{100 * gap['gap']:.1f} points); KL {gap['kl']:.2f} nats per sample; the prior halts after "
            f"{gap['prior_halt_steps']:.1f} steps, the posterior after {gap['posterior_halt_steps']:.1f}.",
        ]
    if "compute" in report:
        lines += ["", *compute_table({report.get("model", "model"): report})]
    return "\n".join(lines) + "\n"


def compute_table(reports: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines: the compute cells of each named report as two tables, after a line per report saying
    what one supervision step costs (a cell's inference FLOPs per puzzle are steps x samples x that, plus the
    value head's for each sample it scores). The depth table has one trajectory's accuracy at each depth; the
    width table, for each depth, the accuracy of each selection against the number of samples. Each table's
    ``ms / puzzle`` row times the cells above it (puzzles solved one at a time)."""
    lines = ["Test-time compute: accuracy against inference FLOPs and time per puzzle", ""]
    for name, report in reports.items():
        compute = report["compute"]
        noise = f", state noise σ = {compute['state_noise']:g}" if compute["state_noise"] else ""
        lines.append(
            f"- {name}: one supervision step of one puzzle {compute['step_flops']:.3g} FLOPs, the value head "
            f"{compute['value_head_flops']:.3g}{noise}; times over {compute['settings']['timing_puzzles']} "
            "puzzles solved one at a time"
        )

    def percent(cell: dict[str, Any] | None) -> str:
        return "-" if cell is None else f"{100 * cell['accuracy']:.1f}%"

    def ms(cell: dict[str, Any] | None) -> str:
        return "-" if cell is None or cell.get("ms_per_puzzle") is None else f"{cell['ms_per_puzzle']:.1f}"

    cells = {name: report["compute"]["cells"] for name, report in reports.items()}
    depths = sorted({c["steps"] for found in cells.values() for c in found if c["curve"] == "depth"})
    if depths:
        lines += ["", "One trajectory, by supervision steps:", ""]
        lines += [f"| model | {' | '.join(map(str, depths))} |", "|---|" + "---|" * len(depths)]
        for name, found in cells.items():
            at = {c["steps"]: c for c in found if c["curve"] == "depth"}
            if at:
                lines.append(f"| {name} | {' | '.join(percent(at.get(d)) for d in depths)} |")
                lines.append(f"| {name}, ms / puzzle | {' | '.join(ms(at.get(d)) for d in depths)} |")
    widths = sorted({c["samples"] for found in cells.values() for c in found if c["curve"] == "width"})
    if widths:
        lines += ["", "Samples at a fixed depth, by the number of samples:", ""]
        lines += [
            f"| model | steps | select | {' | '.join(map(str, widths))} |",
            "|---|---|---|" + "---|" * len(widths),
        ]
        for name, found in cells.items():
            width = [c for c in found if c["curve"] == "width"]
            for steps in sorted({c["steps"] for c in width}):
                at = {(c["select"], c["samples"]): c for c in width if c["steps"] == steps}
                selects = list(dict.fromkeys(c["select"] for c in width if c["steps"] == steps))
                for select in selects:
                    row = " | ".join(percent(at.get((select, k))) for k in widths)
                    lines.append(f"| {name} | {steps} | {select} | {row} |")
                timed = " | ".join(ms(at.get((selects[0], k))) for k in widths)
                lines.append(f"| {name} | {steps} | ms / puzzle | {timed} |")
    return lines


def plot_compute(reports: dict[str, dict[str, Any]], path: Path, title: str = "") -> None:
    """Accuracy against inference FLOPs per puzzle (log scale), as GRAM's Figure 4 (left), one panel per named
    report on shared axes: its depth curve (one trajectory, more steps, in black) and its width curves (more
    samples at a fixed depth), one colour per depth and one line style per selection."""
    plt = pyplot()

    styles = {"vote": "s-", "value": "^--", "q": "v:"}
    depths = sorted(
        {c["steps"] for r in reports.values() for c in r["compute"]["cells"] if c["curve"] == "width"}
    )
    colors = {d: f"C{i}" for i, d in enumerate(depths)}
    columns = min(2, len(reports))
    rows = -(-len(reports) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.6 * columns + 2.2, 3.6 * rows), sharex=True, sharey=True, squeeze=False
    )
    for ax, (name, report) in zip(axes.flat, reports.items(), strict=False):
        cells = report["compute"]["cells"]
        depth = [c for c in cells if c["curve"] == "depth"]
        if depth:
            ax.plot(
                [c["flops"] for c in depth], [c["accuracy"] for c in depth], "o-", color="black", lw=2,
                markersize=4, label="depth (1 sample)",
            )  # fmt: skip
        widths = [c for c in cells if c["curve"] == "width"]
        for d in sorted({c["steps"] for c in widths}):
            for mode, style in styles.items():
                line = [c for c in widths if c["steps"] == d and c["select"] == mode]
                if line:
                    ax.plot(
                        [c["flops"] for c in line], [c["accuracy"] for c in line], style, color=colors[d],
                        markersize=3, label=f"width at {d} steps, {mode}",
                    )  # fmt: skip
        ax.set_xscale("log")
        noise = report["compute"]["state_noise"]
        ax.set(title=f"{name}, state noise σ = {noise:g}" if noise else name, ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3, which="both")
    for ax in axes.flat[len(reports) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("inference FLOPs per puzzle")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path, bbox_inches="tight")


def plot_curves(report: dict[str, Any], path: Path) -> None:
    """Accuracy against steps and against samples, side by side, as a PNG; for GRAM a third panel, the gap
    between its prior and its posterior on training puzzles (:mod:`latentloop.eval.gap`), with the KL of each
    supervision step."""
    plt = pyplot()

    gap = report.get("gap")
    fig, axes = plt.subplots(1, 3 if gap else 2, figsize=(13.5 if gap else 9, 3.5))
    left, right = axes[0], axes[1]
    left.plot(
        [p["steps"] for p in report["curve_steps"]], [p["accuracy"] for p in report["curve_steps"]], "o-"
    )
    left.set(xlabel="supervision steps", ylabel="accuracy", title=f"depth ({report['samples']} samples)")
    ks = [p["samples"] for p in report["curve_samples"]]
    for key in ("vote", "value", "coverage"):
        if key in report["curve_samples"][0]:
            right.plot(ks, [p[key] for p in report["curve_samples"]], "o-", label=key)
    right.set(xlabel="samples", title=f"width ({report['steps']} steps)")
    right.legend()
    if gap:
        steps = range(1, len(gap["kl_per_step"]) + 1)
        axes[2].bar(steps, gap["kl_per_step"], color="tab:gray")
        axes[2].set(
            xlabel="supervision step",
            ylabel="KL (nats per sample)",
            title=f"training puzzles: prior {100 * gap['prior_valid']:.0f}%, "
            f"posterior {100 * gap['posterior_valid']:.0f}%",
        )
    fig.tight_layout()
    save_png(fig, path)


def plot_boards(examples: dict[str, list[dict[str, Any]]], task: Task, path: Path) -> None:
    """The example answers of each model (a row each, from :func:`example_answers`) drawn by the task, titled
    with the verifier's verdict and, for multi-solution tasks, the distinct valid answers the samples found."""
    plt = pyplot()

    columns = max(len(rows) for rows in examples.values())
    fig, axes = plt.subplots(
        len(examples), columns, figsize=(2.3 * columns, 2.5 * len(examples)), squeeze=False
    )
    for row, (name, answers) in zip(axes, examples.items(), strict=True):
        for ax in row:
            ax.axis("off")
        for ax, example in zip(row, answers, strict=False):
            ax.axis("on")
            puzzle = task.decode(np.asarray(example["puzzle"]))
            task.draw(ax, puzzle, task.decode_answer(np.asarray(example["answer"])))
            verdict = "valid" if example["violations"] == 0 else f"{example['violations']} broken"
            title = f"#{example['index']}: {verdict}"
            if "solutions" in example:
                title += f"\n{example['valid_found']} of {example['solutions']} solutions found"
            ax.set_title(title, fontsize=8, color="black" if example["violations"] == 0 else "tab:red")
        row[0].set_ylabel(name)
    fig.tight_layout()
    save_png(fig, path, dpi=100, bbox_inches="tight")


def write_reports(report: dict[str, Any], folder: str | Path, task: Task | None = None) -> None:
    """``eval.json``, ``eval.md`` and ``eval_curves.png`` in ``folder``; with a ``task`` that can draw its
    answers, ``eval_boards.png`` too, and ``eval_compute.png`` when the report measured a compute grid."""
    folder = Path(folder)
    atomic_write_text(folder / "eval.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(folder / "eval.md", markdown_table(report))
    plot_curves(report, folder / "eval_curves.png")
    if "compute" in report:
        plot_compute({report.get("model", "model"): report}, folder / "eval_compute.png")
    if task is not None and task.drawable and report.get("examples"):
        plot_boards({report.get("model", "model"): report["examples"]}, task, folder / "eval_boards.png")
