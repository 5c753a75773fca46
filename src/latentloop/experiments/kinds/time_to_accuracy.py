"""``kind: time-to-accuracy``: how fast reasoners reach the experiment's ``targets`` (accuracy, coverage), its
models the rows of an ablation, each adding one option to the row before.

Every model keeps a checkpoint every ``eval.every`` batches, and each checkpoint is evaluated against what its
training had cost by then (minutes, examples seen, FLOPs); the points are cached in ``MODEL/curve.json``, so a
rerun evaluates only new checkpoints. The results hold each model's curve, the first point reaching each
target, and each row's gain over the row before it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from latentloop.config import load_yaml
from latentloop.eval.reasoners import evaluate_reasoner
from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.experiments.kinds.reasoners import eval_steps
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
from latentloop.experiments.store import read_json, write_json
from latentloop.experiments.training import relative_config
from latentloop.plotting import pyplot
from latentloop.train.checkpoint import list_checkpoints, read_trainer_state

COST_KEYS = ("step", "train_minutes", "examples_seen", "flops")
FINAL_KEYS = (*COST_KEYS, "accuracy", "accuracy_1_sample", "accuracy_value", "coverage")


class TimeToAccuracyKind(ExperimentKind):
    """Accuracy and coverage against training cost, checkpoint by checkpoint. Options: ``eval.every`` (batches
    between checkpoints), ``samples``, ``steps``, ``limit``, ``seed``, ``temperature``, ``split``, and the
    experiment's ``targets``; ``eval.select`` and ``eval.fit_value`` are not used."""

    def trained_specs(self, experiment: Experiment) -> list[ModelSpec]:
        """Each model with a checkpoint every ``eval.every`` batches, all of them kept, and no evaluation of
        its own while it trains (that would count in its minutes). These come after its own overrides, so they
        win, and being part of the overrides they are recorded in ``train.json`` and checked alike on a
        rerun."""
        return [
            dataclasses.replace(
                spec,
                overrides=[
                    *spec.overrides,
                    f"train.checkpoint_every={experiment.eval_for(spec).every}",
                    "train.keep_checkpoints=0",
                    "train.eval_every=0",
                ],
            )
            for spec in experiment.models
        ]

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
        """The model's row: its curve over all checkpoints, what it adds to the row before, its summary."""
        own = experiment.models[index]
        curve = evaluate_curve(spec, folder, trained["arch"], experiment.eval_for(spec), log)
        return {
            "train": trained,
            "config": relative_config(own.config, experiment),
            "adds": _adds(own, experiment.models[index - 1] if index else None, experiment),
            "curve": curve,
            "summary": curve_summary(curve, experiment.targets),
        }

    def aggregate(self, experiment: Experiment, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The targets, and the gain of each row over the row before it."""
        return {"targets": experiment.targets, "ablation": ablation_gains(rows, experiment.targets)}

    def summary_rows(self, results: dict[str, Any]) -> list[dict[str, Any]]:
        """Each model's final checkpoint, and when each target was first reached."""
        rows = []
        for name, row in results["models"].items():
            final = row["summary"]["final"] or {}
            rows.append(
                {
                    "model": name,
                    "parameters": row["train"]["parameters"],
                    "config": row["config"],
                    "adds": row["adds"],
                    "checkpoints": row["summary"]["points"],
                    "batches": final.get("step"),
                    "train_minutes": final.get("train_minutes"),
                    "examples_seen": final.get("examples_seen"),
                    "flops": final.get("flops"),
                    "accuracy_vote": final.get("accuracy"),
                    "accuracy_value": final.get("accuracy_value"),
                    "accuracy_1_sample": final.get("accuracy_1_sample"),
                    "coverage": final.get("coverage"),
                    "conflicts_total": None,
                    "targets": {m: t["reached"] for m, t in row["summary"]["targets"].items()},
                }
            )
        return rows

    def report_markdown(self, results: dict[str, Any], command: str | None) -> str:
        """The final checkpoints and the targets reached, and the ablation's gains row by row."""
        ev, targets = results["eval"], results.get("targets", {})
        rows = self.summary_rows(results)
        curves = [row["curve"] for row in results["models"].values() if row["curve"]]
        split = ev.get("split", "test")
        puzzles = f"{curves[0][-1]['puzzles']} {split} puzzles, " if curves else ""
        details = (
            f"; a checkpoint every {ev['every']} batches, each evaluated on {puzzles}"
            f"{_count(ev['samples'], 'sample')}, {ev['steps']} steps"
        )
        details += temperature_details(ev)
        lines = report_heading(results, details, command)
        header = (
            "| model | adds | checkpoints | accuracy, 1 sample | accuracy, vote | coverage | "
            "trained (min / examples / FLOPs) |"
        )
        rule = "|---|---|---|---|---|---|---|"
        for metric, target in targets.items():
            header += f" {metric} ≥ {target:g}% first at (min / examples / FLOPs) |"
            rule += "---|"
        lines += [
            "",
            "Final checkpoint of each model, and when each target was first reached:",
            "",
            header,
            rule,
        ]
        for r in rows:
            adds = ", ".join(f"`{a}`" for a in r["adds"]) or "-"
            trained = "-" if r["train_minutes"] is None else _cost(r)
            line = (
                f"| {r['model']} | {adds} | {r['checkpoints']} | {percent(r['accuracy_1_sample'])} | "
                f"{percent(r['accuracy_vote'])} | {percent(r['coverage'])} | {trained} |"
            )
            for metric in targets:
                line += f" {_cost(r['targets'][metric])} |"
            lines.append(line)
        if results.get("ablation"):
            lines += [
                "",
                "Ablation, each row against the one before it (time-to-target ratio: the row before's training "
                "minutes over this row's, above 1 is sooner):",
                "",
                *(_gain_line(gain, targets) for gain in results["ablation"]),
            ]
        lines += [
            "",
            "Accuracy and coverage against training minutes, examples seen and FLOPs: `curves.png`.",
        ]
        return report_end(lines, results)

    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        """Each model's accuracies and coverage at its final checkpoint."""
        return accuracy_lines(self.summary_rows(results))

    def plot(self, results: dict[str, Any], path: Path) -> None:
        """Accuracy (top) and coverage (bottom, for tasks with several solutions) against training minutes,
        examples seen and FLOPs, one line per model, the targets dashed; points without FLOPs are left out of
        the FLOPs column."""
        plt = pyplot()
        curves = [p for row in results["models"].values() for p in row["curve"]]
        metrics = [("accuracy", "accuracy (vote)")]
        if any(p.get("coverage") is not None for p in curves):
            metrics.append(("coverage", "coverage"))
        fig, axes = plt.subplots(len(metrics), 3, figsize=(12.6, 3.5 * len(metrics)), squeeze=False)
        columns = (
            ("train_minutes", "training minutes"),
            ("examples_seen", "examples seen"),
            ("flops", "FLOPs"),
        )
        targets = results.get("targets", {})
        for name, row in results["models"].items():
            for r, (metric, _) in enumerate(metrics):
                for c, (cost, _) in enumerate(columns):
                    points = [
                        p for p in row["curve"] if p.get(cost) is not None and p.get(metric) is not None
                    ]
                    if points:
                        axes[r][c].plot(
                            [p[cost] for p in points],
                            [p[metric] for p in points],
                            "o-",
                            label=name,
                            markersize=3,
                        )
        for r, (metric, label) in enumerate(metrics):
            for c, (_, xlabel) in enumerate(columns):
                ax = axes[r][c]
                if metric in targets:
                    ax.axhline(targets[metric] / 100, color="gray", linestyle="--", linewidth=1)
                ax.set(xlabel=xlabel, ylabel=label, ylim=(-0.02, 1.02))
                ax.grid(alpha=0.3)
        drawn = [ax for ax in axes.flat if ax.get_legend_handles_labels()[0]]
        if drawn:
            drawn[0].legend(fontsize=8)
        fig.suptitle(results["experiment"])
        save_figure(fig, path)


def evaluate_checkpoint(checkpoint: Path, arch: str, settings: EvalSpec) -> dict[str, Any]:
    """One point of a time-to-accuracy curve: ``checkpoint`` evaluated on ``settings.split``, beside what its
    training had cost by then (from its ``trainer_state.json``).

    Accuracies and coverage are fractions, as in the other reports: ``accuracy`` is the vote over all
    ``settings.samples`` samples, ``accuracy_1_sample`` that of one sample, ``coverage`` the share of distinct
    solutions found by all samples (``None`` for tasks with one solution). ``flops`` is ``None`` for
    checkpoints that do not record it.
    """
    state = read_trainer_state(checkpoint)
    report = evaluate_reasoner(
        checkpoint,
        samples=settings.samples,
        steps=eval_steps(arch, settings),
        limit=settings.limit,
        seed=settings.seed,
        temperature=settings.temperature,
        write=False,
        progress=False,
        split=settings.split,
    )
    by_select = report["accuracy_by_select"]
    flops = state.get("flops")
    return {
        "step": state["step"],
        "checkpoint": f"{checkpoint.parent.name}/{checkpoint.name}",  # relative to the model's folder
        "train_minutes": round(float(state.get("train_seconds", 0.0)) / 60, 5),
        "examples_seen": int(state.get("examples_seen", 0)),
        "flops": None if flops is None else float(flops),
        "puzzles": report["puzzles"],
        "accuracy": by_select["vote"],
        "accuracy_1_sample": report["curve_samples"][0]["vote"],
        "accuracy_value": by_select.get("value"),
        "coverage": report.get("coverage"),
    }


def evaluate_curve(
    spec: ModelSpec, folder: Path, arch: str, settings: EvalSpec, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every checkpoint of the run folder evaluated (:func:`evaluate_checkpoint`), ordered by step.

    The points are cached in ``MODEL/curve.json`` keyed by checkpoint step, written after each one: a rerun
    evaluates only the checkpoints it has not seen (all of them again when the evaluation settings changed).
    """
    wanted = {
        "samples": settings.samples,
        "steps": eval_steps(arch, settings),
        "limit": settings.limit,
        "seed": settings.seed,
        "temperature": settings.temperature,
    }
    if settings.split != "test":  # caches written before eval.split existed stay valid
        wanted["split"] = settings.split
    cache = read_json(folder / "curve.json")
    points: dict[str, dict[str, Any]] = {}
    if cache is not None and cache.get("settings") == wanted and isinstance(cache.get("points"), dict):
        points = cache["points"]
    elif cache is not None:
        log(f"{spec.name}: evaluation settings changed, evaluating every checkpoint again")
    todo = [c for c in list_checkpoints(folder) if str(read_trainer_state(c)["step"]) not in points]
    if not todo:
        log(f"{spec.name}: {len(points)} checkpoints evaluated already, skipping")
    for number, checkpoint in enumerate(todo, 1):
        log(f"{spec.name}: evaluating {checkpoint.name} ({number}/{len(todo)})")
        point = evaluate_checkpoint(checkpoint, arch, settings)
        points[str(point["step"])] = point
        write_json(folder / "curve.json", {"settings": wanted, "points": points})
    return sorted(points.values(), key=lambda p: p["step"])


def first_reached(curve: list[dict[str, Any]], metric: str, target: float) -> dict[str, Any] | None:
    """The first point of ``curve`` (ordered by step) whose ``metric`` (a fraction) reaches ``target`` (a
    percent), or ``None`` when none does."""
    for point in curve:
        value = point.get(metric)
        if value is not None and 100 * value >= target - 1e-9:  # 0.57 * 100 is 56.99999999999999
            return point
    return None


def curve_summary(curve: list[dict[str, Any]], targets: dict[str, float]) -> dict[str, Any]:
    """A model's row of a time-to-accuracy experiment: the final point's values, and for each target (metric
    -> percent) its cost (step, minutes, examples, FLOPs) when first reached, or ``None``."""
    reached = {}
    for metric, target in targets.items():
        point = first_reached(curve, metric, target)
        reached[metric] = {
            "target": target,
            "reached": None if point is None else {k: point.get(k) for k in COST_KEYS},
        }
    return {
        "points": len(curve),
        "final": {k: curve[-1].get(k) for k in FINAL_KEYS} if curve else None,
        "targets": reached,
    }


def _difference(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 6)


def ablation_gains(rows: dict[str, dict[str, Any]], targets: dict[str, float]) -> list[dict[str, Any]]:
    """What each row of a time-to-accuracy experiment gains over the row before it: for each target the
    time-to-target ratio (the row before's minutes over this row's; above 1 is sooner) when both reach it,
    else ``None``; and the differences in final accuracy and coverage (fractions)."""
    gains = []
    for before, after in itertools.pairwise(rows):
        old, new = rows[before]["summary"], rows[after]["summary"]
        ratios: dict[str, float | None] = {}
        for metric in targets:
            a, b = old["targets"][metric]["reached"], new["targets"][metric]["reached"]
            both = a is not None and b is not None and b["train_minutes"] > 0
            ratios[metric] = round(a["train_minutes"] / b["train_minutes"], 3) if both else None
        old_final, new_final = old["final"] or {}, new["final"] or {}
        gains.append(
            {
                "model": after,
                "over": before,
                "adds": rows[after]["adds"],
                "time_to_target_ratio": ratios,
                "accuracy_difference": _difference(new_final.get("accuracy"), old_final.get("accuracy")),
                "coverage_difference": _difference(new_final.get("coverage"), old_final.get("coverage")),
            }
        )
    return gains


def _adds(spec: ModelSpec, before: ModelSpec | None, experiment: Experiment) -> list[str]:
    """The options ``spec`` adds to the ablation row before it: its overrides that row lacks, the run config's
    own value of each key that row overrode and this one leaves alone (``train.lr=0.0015 (config)``), and its
    run config when that differs (the first row: all its overrides)."""
    if before is None:
        return list(spec.overrides)
    added = [o for o in spec.overrides if o not in before.overrides]
    kept = {o.partition("=")[0] for o in spec.overrides}
    config = load_yaml(spec.config)
    for override in before.overrides:
        key = override.partition("=")[0]
        if key not in kept:
            value = _config_value(config, key)
            added.append(f"{key} default" if value is None else f"{key}={value} (config)")
    if spec.config != before.config:
        added.insert(0, f"config {relative_config(spec.config, experiment)}")
    return added


def _config_value(config: dict[str, Any], dotted: str) -> str | None:
    """The value a run config gives the dotted key, as JSON text (None where the config lacks it)."""
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, str) else json.dumps(value)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _minutes(value: float) -> str:
    return f"{value:.3g}"


def _cost(point: dict[str, Any] | None) -> str:
    """``minutes / examples / FLOPs`` of a curve point, or ``not reached``."""
    if point is None:
        return "not reached"
    return f"{_minutes(point['train_minutes'])} / {point['examples_seen']:,} / {format_flops(point['flops'])}"


def _gain_line(gain: dict[str, Any], targets: dict[str, float]) -> str:
    """One row's gain over the row before it: the time-to-target ratios where both reach a target, else (or
    for a target not reached by both) the differences in final accuracy and coverage."""
    adds = f" (+ {', '.join(gain['adds'])})" if gain["adds"] else ""
    parts = []
    for metric, target in targets.items():
        ratio = gain["time_to_target_ratio"][metric]
        label = f"{metric} ≥ {target:g}%"
        parts.append(
            f"{label} reached {ratio:.2f}x as fast"
            if ratio is not None
            else f"{label}: not reached by both rows"
        )
    if not targets or any(r is None for r in gain["time_to_target_ratio"].values()):

        def points(value: float | None) -> str:
            return "-" if value is None else f"{100 * value:+.1f} points"

        parts.append(
            f"final accuracy {points(gain['accuracy_difference'])}, coverage {points(gain['coverage_difference'])}"
        )
    return f"- {gain['model']}{adds} over {gain['over']}: " + "; ".join(parts)
