"""``kind: reasoners`` (the default): puzzle reasoners evaluated alike on the test split, with depth (steps
``1..steps``) and width (samples ``1..samples``) curves, beside the paper's numbers; where the experiment asks
for a compute grid, accuracy against inference FLOPs and time per puzzle (``compute.png``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from latentloop.eval.grid import ComputeGrid
from latentloop.eval.reasoners import (
    compute_table,
    evaluate_reasoner,
    load_run,
    plot_boards,
    plot_compute,
    run_dataset,
)
from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.experiments.report import (
    accuracy_lines,
    format_flops,
    percent,
    report_end,
    report_heading,
    save_figure,
    temperature_details,
)
from latentloop.experiments.spec import EvalSpec, Experiment, ModelSpec
from latentloop.experiments.store import portable, read_json, write_json
from latentloop.models.reasoners import REASONERS
from latentloop.plotting import pyplot
from latentloop.tasks.base import get_task
from latentloop.train.run_config import load_reasoner_run_config
from latentloop.train.value import fit_value_head, save_value_head


class ReasonersKind(ExperimentKind):
    """Puzzle reasoners on one task: accuracy by vote, value head and one sample, coverage, and how they grow
    with supervision steps and samples; ``eval.fit_value`` first fits a stochastic model's value head to its
    own samples. Options: ``eval.samples``, ``steps``, ``limit``, ``select``, ``seed``, ``temperature``,
    ``fit_value``, ``split``, and the compute grid's ``steps_grid``, ``samples_grid``, ``width_depths``,
    ``state_noise``, ``timing_puzzles`` (:class:`~latentloop.eval.grid.ComputeGrid`)."""

    def evaluate(
        self,
        experiment: Experiment,
        index: int,
        spec: ModelSpec,
        folder: Path,
        trained: dict[str, Any],
        progress: bool,
        log: Callable[[str], None],
    ) -> dict[str, Any]:
        """The model's row: its training summary and its evaluation (``eval.json``)."""
        report = evaluate_model(spec, folder, trained["arch"], experiment.eval_for(spec), log, progress)
        return {"train": trained, "eval": report}

    def summary_rows(self, results: dict[str, Any]) -> list[dict[str, Any]]:
        """Each model's size, training, accuracies (vote, value head, one sample), coverage and conflicts."""
        rows = []
        for name, row in results["models"].items():
            report, train = row["eval"], row["train"]
            by_select = report.get("accuracy_by_select", {})
            rows.append(
                {
                    "model": name,
                    "parameters": train["parameters"],
                    "train_minutes": train["train_minutes"],
                    "batches": train["step"],
                    "examples_seen": train["examples_seen"],
                    "flops": train.get("flops"),  # absent from results written before FLOPs were counted
                    "accuracy_vote": by_select.get("vote"),
                    "accuracy_value": by_select.get("value"),
                    "accuracy_1_sample": report["curve_samples"][0]["vote"],
                    "coverage": report.get("coverage"),
                    # One of the samples valid: what a perfect selection rule would score
                    "accuracy_any_sample": report.get("oracle_accuracy"),
                    "conflicts_total": report.get("conflicts_total"),
                }
            )
        return rows

    def report_markdown(self, results: dict[str, Any], command: str | None) -> str:
        """The table beside the paper's numbers, the value heads fitted, and the depth and width curves."""
        ev = results["eval"]
        rows = self.summary_rows(results)
        has_cov = any(r["coverage"] is not None for r in rows)
        first = next(iter(results["models"].values()))["eval"]
        details = f"; {first['puzzles']} {ev.get('split', 'test')} puzzles, {ev['samples']} samples, {ev['steps']} steps"
        details += temperature_details(ev)
        if first.get("metric"):  # ARC: accuracy is pass@2 over the augmented copies of each test input
            details += f"; accuracy is {first['metric']} over {first['copies']} augmented copies"
        lines = report_heading(results, details, command)
        lines += ["", *_table(results, rows, has_cov)]
        lines += _value_fits(results)
        lines += _depth_and_width(results, has_cov)
        computed = {name: row["eval"] for name, row in results["models"].items() if "compute" in row["eval"]}
        if computed:
            lines += ["", *compute_table(computed), "", "Accuracy against inference FLOPs: `compute.png`."]
        if any(row["eval"].get("examples") for row in results["models"].values()):
            lines += ["", "A few answers of each model, solved puzzles first, drawn in `boards.png`."]
        return report_end(lines, results)

    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        """Each model's accuracies and coverage."""
        return accuracy_lines(self.summary_rows(results))

    def plot(self, results: dict[str, Any], path: Path) -> None:
        """Accuracy against steps, accuracy against samples and coverage against samples, every model; with a
        compute grid also ``compute.png`` beside it: accuracy against inference FLOPs per puzzle."""
        plt = pyplot()
        models = results["models"]
        computed = {name: row["eval"] for name, row in models.items() if "compute" in row["eval"]}
        if computed:
            plot_compute(computed, path.parent / "compute.png", results["experiment"])
        has_cov = any("coverage" in row["eval"] for row in models.values())
        panels = 3 if has_cov else 2
        fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6))
        for name, row in models.items():
            report = row["eval"]
            axes[0].plot(
                [p["steps"] for p in report["curve_steps"]], [p["accuracy"] for p in report["curve_steps"]], "o-",
                label=name, markersize=3,
            )  # fmt: skip
            ks = [p["samples"] for p in report["curve_samples"]]
            (vote,) = axes[1].plot(
                ks, [p["vote"] for p in report["curve_samples"]], "o-", label=name, markersize=3
            )
            axes[1].plot(
                ks, [p["value"] for p in report["curve_samples"]], ":", color=vote.get_color(), alpha=0.7
            )
            if has_cov and "coverage" in report:
                axes[2].plot(
                    ks, [p["coverage"] for p in report["curve_samples"]], "o-", label=name, markersize=3
                )
        axes[0].set(xlabel="supervision steps", ylabel="accuracy (vote)", title="depth")
        axes[1].set(xlabel="samples", ylabel="accuracy: vote (dotted: value head)", title="width")
        if has_cov:
            axes[2].set(xlabel="samples", ylabel="coverage", title="distinct solutions found")
        for ax in axes:
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(results["experiment"])
        save_figure(fig, path)

    def draw_examples(self, results: dict[str, Any], out: Path) -> None:
        """``boards.png``: a few answers of every model (solved ones first), where the task can draw them."""
        examples = {
            name: row["eval"]["examples"]
            for name, row in results["models"].items()
            if row["eval"].get("examples")
        }
        if not examples:
            return
        config = load_reasoner_run_config(out / next(iter(examples)) / "config.yaml")
        task = get_task(config.task.name, **config.task.options)
        if task.drawable:
            plot_boards(examples, task, out / "boards.png")


def evaluate_model(
    spec: ModelSpec,
    folder: Path,
    arch: str,
    settings: EvalSpec,
    log: Callable[[str], None],
    progress: bool = True,
) -> dict[str, Any]:
    """The run in ``folder`` (a reasoner ``arch``) evaluated as ``settings`` asks, its value head fitted first
    where ``settings.fit_value`` asks and the model can use one; stored as its ``eval.json``, which a rerun
    with the same settings reads back."""
    steps = eval_steps(arch, settings)
    grid = ComputeGrid.of(settings)
    grid_settings = asdict(grid) if grid.active else None
    fit_steps = settings.fit_value if REASONERS[arch].stochastic and not REASONERS[arch].generative else 0
    wanted = {"samples": settings.samples, "select": settings.select, "seed": settings.seed}
    report = read_json(folder / "eval.json")
    if (
        report is not None
        and all(report.get(k) == v for k, v in wanted.items())
        and report.get("limit") == settings.limit
        and report.get("temperature", 1.0) == settings.temperature
        and report.get("requested_steps", report.get("steps")) == steps
        and report.get("value_fit", {}).get("steps", 0) == fit_steps
        and report.get("split", "test") == settings.split
        and report.get("compute_settings") == grid_settings
    ):
        log(f"{spec.name}: evaluated already, skipping")
        return report  # written by portable(): its paths are relative to the output folder already
    value_fit = _fit_value(spec, folder, fit_steps, settings, log, progress) if fit_steps else None
    log(f"{spec.name}: evaluating ({settings.samples} samples, steps 1..{steps or 'model default'})")
    report = evaluate_reasoner(
        folder,
        samples=settings.samples,
        steps=steps,
        select=settings.select,
        limit=settings.limit,
        seed=settings.seed,
        temperature=settings.temperature,
        progress=None if progress else False,
        label=f"{spec.name}: evaluating",
        split=settings.split,
        grid=grid,
    )
    report["limit"], report["requested_steps"] = settings.limit, steps
    if grid_settings is not None:
        report["compute_settings"] = grid_settings
    if value_fit is not None:
        report["value_fit"] = value_fit
    report = portable(report, folder.parent)
    write_json(folder / "eval.json", report)
    return report


def eval_steps(arch: str, settings: EvalSpec) -> int | None:
    """The supervision steps a reasoner ``arch`` is evaluated at: the experiment's ``eval.steps``, or
    ``None`` (its own default) for a generative baseline."""
    # The generative baselines decode with their own loop (AR: one pass; MDLM: its unmasking steps), so the
    # experiment's supervision-step count does not apply to them.
    return None if REASONERS[arch].generative else settings.steps


def _fit_value(
    spec: ModelSpec, folder: Path, steps: int, settings: EvalSpec, log: Callable[[str], None], progress: bool
) -> dict[str, Any]:
    """Fit a value head to the run's own samples (:func:`latentloop.train.value.fit_value_head`) and save it
    beside the checkpoint the evaluation loads."""
    log(f"{spec.name}: fitting the value head to its own samples ({steps} updates)")
    model, task, checkpoint, _ = load_run(folder)
    split = run_dataset(folder, folder).split("train")
    head, summary = fit_value_head(
        model,
        task,
        split,
        steps=steps,
        seed=settings.seed,
        temperature=settings.temperature,
        progress=None if progress else False,
    )
    summary["file"] = str(save_value_head(head, checkpoint, summary))
    return summary


def _table(results: dict[str, Any], rows: list[dict[str, Any]], has_cov: bool) -> list[str]:
    """The main table: each model's size, training and accuracies; where the task counts them, its coverage,
    the share of puzzles with a valid answer among its samples and its conflicts; and the paper's numbers
    where the experiment gives them."""
    has_conf = any(r["conflicts_total"] is not None for r in rows)
    header = (
        "| model | parameters | trained (min / batches / FLOPs) | accuracy, 1 sample | accuracy, vote | "
        "accuracy, value |"
    )
    rule = "|---|---|---|---|---|---|"
    if has_cov:
        header, rule = header + " any sample valid | coverage |", rule + "---|---|"
    if has_conf:
        header, rule = header + " conflicts (total) |", rule + "---|"
    if results["paper"]:
        header, rule = header + " paper |", rule + "---|"
    lines = [header, rule]
    for r in rows:
        line = (
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['batches']} / "
            f"{format_flops(r['flops'])} | {percent(r['accuracy_1_sample'])} | {percent(r['accuracy_vote'])} | "
            f"{percent(r['accuracy_value'])} |"
        )
        if has_cov:
            line += f" {percent(r['accuracy_any_sample'])} | {percent(r['coverage'])} |"
        if has_conf:
            line += " - |" if r["conflicts_total"] is None else f" {r['conflicts_total']} |"
        if results["paper"]:
            paper = results["paper"].get(r["model"], {})
            line += " " + (" / ".join(f"{k} {v:g}" for k, v in paper.items()) or "-") + " |"
        lines.append(line)
    return lines


def _value_fits(results: dict[str, Any]) -> list[str]:
    """A paragraph for each model whose value head was fitted after training."""
    lines = []
    for name, row in results["models"].items():
        if "value_fit" not in row["eval"]:
            continue
        fit = row["eval"]["value_fit"]
        auc = "n/a" if fit.get("held_out_auc") is None else f"{fit['held_out_auc']:.3f}"
        lines += [
            "",
            f"{name}'s value head was fitted to its own samples after training (`latentloop fit-value`, "
            f"{fit['steps']} updates on {fit['rollouts']:,} rollouts, {fit['seconds']:.0f} s, not counted in "
            f"the training budget); ROC AUC for a valid last-step answer on {fit['held_out_rollouts']} fresh rollouts: "
            f"{auc}.",
        ]
    return lines


def _depth_and_width(results: dict[str, Any], has_cov: bool) -> list[str]:
    """The tables of accuracy against supervision steps, and of vote, value and coverage against samples."""
    ev = results["eval"]
    curves = {name: row["eval"] for name, row in results["models"].items()}
    steps = sorted({p["steps"] for report in curves.values() for p in report["curve_steps"]})
    shown_steps = [s for s in steps if s <= 4 or s in (8, 16, 32) or s == steps[-1]]
    lines = [
        "",
        "Accuracy (vote) against depth: supervision steps (MDLM: unmasking steps; AR decodes in one pass):",
        "",
        "| model | " + " | ".join(str(s) for s in shown_steps) + " |",
        "|---|" + "---|" * len(shown_steps),
    ]
    for name, report in curves.items():
        by_step = {p["steps"]: p["accuracy"] for p in report["curve_steps"]}
        lines.append(f"| {name} | " + " | ".join(percent(by_step.get(s)) for s in shown_steps) + " |")
    ks = [k for k in (1, 2, 5, 10, 20, 50, 100) if k <= ev["samples"]]
    if ev["samples"] not in ks:
        ks.append(ev["samples"])
    lines += [
        "",
        "Against samples at the last step: vote / value" + (" / coverage" if has_cov else ""),
        "",
        "| model | " + " | ".join(str(k) for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    for name, report in curves.items():
        by_k = {p["samples"]: p for p in report["curve_samples"]}
        cells = []
        for k in ks:
            p = by_k[k]
            parts = [percent(p["vote"]), percent(p["value"])] + (
                [percent(p.get("coverage"))] if has_cov else []
            )
            cells.append(" / ".join(parts))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
