"""``kind: lm``: recurrent-depth language models, each evaluated at the test-time depths ``eval.depths``, on
its held-out split or on each of ``eval.tiers``, and on the depth x width grid of ``eval.width``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from latentloop.eval.lm import evaluate_lm
from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.experiments.report import percent, report_end, report_heading, save_figure
from latentloop.experiments.spec import EvalSpec, Experiment, ModelSpec
from latentloop.experiments.store import portable, read_json, write_json
from latentloop.experiments.training import LM_RUNS
from latentloop.plotting import pyplot


class LanguageModelKind(ExperimentKind):
    """Recurrent-depth LMs against test-time depth. Options: ``eval.depths``, ``limit``, ``tiers`` (held-out
    tiers, name -> task options laid over the run's; a table row each) and ``width`` (a depth x width grid on
    one tier: the majority answer of K latent trajectories at depth r, for r * K within its compute)."""

    runs = LM_RUNS

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
        """The model's row: its training summary and its metric by depth (``eval.json``)."""
        return {"train": trained, "eval": evaluate_depths(spec, folder, experiment.eval_for(spec), log)}

    def summary_rows(self, results: dict[str, Any]) -> list[dict[str, Any]]:
        """A row per model and tier: its metric, and the share of prompt positions right, by depth."""
        rows = []
        for name, row in results["models"].items():
            metric = row["eval"]["metric"]
            tiers = row["eval"].get("tiers") or [{"tier": None, "results": row["eval"]["results"]}]
            rows += [
                {
                    "model": name,
                    "tier": tier["tier"],
                    "parameters": row["train"]["parameters"],
                    "train_minutes": row["train"]["train_minutes"],
                    "steps": row["train"]["step"],
                    "metric": metric,
                    "by_depth": {r["num_steps"]: r[metric] for r in tier["results"]},
                    "prefix_by_depth": {
                        r["num_steps"]: r["prefix_accuracy"]
                        for r in tier["results"]
                        if "prefix_accuracy" in r
                    },
                }
                for tier in tiers
            ]
        return rows

    def report_markdown(self, results: dict[str, Any], command: str | None) -> str:
        """The metric (and the prompt positions right) against depth, the width grids, the paper's numbers."""
        rows = self.summary_rows(results)
        lines = report_heading(results, "", command)
        metric = rows[0]["metric"].replace("_", " ")
        lines += _depth_table(
            rows, "by_depth", f"Held-out {metric} against test-time depth (recurrent-core iterations)"
        )
        if any(r["prefix_by_depth"] for r in rows):
            lines += _depth_table(
                rows,
                "prefix_by_depth",
                "Share of the prompt positions whose greedy token is the intermediate result that training labels "
                "them with (for permutations: the letters whose running product the model names), the same problems",
            )
        for name, row in results["models"].items():
            if row["eval"].get("width"):
                lines += ["", *_width_table(name, row["eval"]["width"])]
        for name, paper in results["paper"].items():
            lines += ["", f"Paper ({name}): " + "; ".join(f"{k} {v}" for k, v in paper.items())]
        return report_end(lines, results)

    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        """Each row's metric by depth."""
        return [
            f"{row['model']:<8} {row['parameters']:>11,}  {row['metric']}  "
            + "  ".join(f"r={d}: {value:.3g}" for d, value in sorted(row["by_depth"].items()))
            for row in self.summary_rows(results)
        ]

    def plot(self, results: dict[str, Any], path: Path) -> None:
        """The metric (and the prompt positions right) against depth, a line per row, and each width grid
        against compute r * K."""
        plt = pyplot()
        models = results["models"]
        grids = [(name, row["eval"]["width"]) for name, row in models.items() if row["eval"].get("width")]
        rows = self.summary_rows(results)
        curves = [("by_depth", rows[0]["metric"].replace("_", " "))]
        if any(row["prefix_by_depth"] for row in rows):
            curves.append(("prefix_by_depth", "prompt positions right (prefix labels)"))
        panels = len(curves) + len(grids)
        fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 4.6), squeeze=False)
        one_model = len(models) == 1
        for ax, (key, ylabel) in zip(axes[0], curves, strict=False):
            for row in rows:
                depths = sorted(row[key])
                if row["tier"] is None:
                    label = row["model"]
                else:
                    label = row["tier"] if one_model else f"{row['model']}, {row['tier']}"
                ax.plot(depths, [row[key][d] for d in depths], "o-", label=label, markersize=3)
            ax.set(xscale="log", xlabel="test-time depth (core iterations)", ylabel=ylabel)
            ax.grid(alpha=0.3)
            # Below the axes: with many tiers a legend inside would hide the curves.
            ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        for ax, (name, width) in zip(axes[0][len(curves) :], grids, strict=True):
            for k in sorted({c["samples"] for c in width["cells"]}):
                at = sorted((c for c in width["cells"] if c["samples"] == k), key=lambda c: c["num_steps"])
                ax.plot(
                    [c["num_steps"] * k for c in at], [c["exact_match"] for c in at], "o-", label=f"K={k}"
                )
            ax.set(
                xscale="log",
                xlabel="test-time compute r * K (core iterations x trajectories)",
                ylabel="exact match, majority vote",
            )
            ax.set_title(
                f"{name}: depth x width" + (f"\n{width['tier']}" if width.get("tier") else ""), fontsize=9
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(results["experiment"])
        save_figure(fig, path)


def evaluate_depths(spec: ModelSpec, folder: Path, settings: EvalSpec, log: Callable[[str], None]) -> dict:
    """The held-out metric at each depth of ``settings.depths``, on the run's held-out split or on each of
    ``settings.tiers``, and the depth x width grid of ``settings.width`` (stored as the run's ``eval.json``;
    a rerun with the same settings reads it back)."""
    wanted = {
        "depths": settings.depths,
        "limit": settings.limit,
        "tiers": settings.tiers,
        "width": settings.width,
    }
    report = read_json(folder / "eval.json")
    if report is not None and report.get("settings") == wanted:
        log(f"{spec.name}: evaluated already, skipping")
        return report  # written by portable(): its paths are relative to the output folder already
    log(f"{spec.name}: evaluating at depths {', '.join(map(str, settings.depths))}")
    if settings.tiers:
        tiers = []
        for name, options in settings.tiers.items():
            log(f"{spec.name}: tier {name}")
            tier = evaluate_lm(
                folder, settings.depths, limit=settings.limit, write=False, task_options=options
            )
            tiers.append({"tier": name, "task_options": options, "results": tier["results"]})
        keep = ("checkpoint", "step", "metric", "init_scale")
        report = {**{k: tier[k] for k in keep}, "tiers": tiers}
    else:
        report = evaluate_lm(folder, settings.depths, limit=settings.limit)
    if settings.width:
        report["width"] = _width_grid(folder, settings, log, spec.name)
    report["limit"] = settings.limit
    report["settings"] = wanted
    report = portable(report, folder.parent)
    write_json(folder / "eval.json", report)
    return report


def _width_grid(folder: Path, settings: EvalSpec, log: Callable[[str], None], name: str) -> dict:
    """Majority-vote accuracy of K latent trajectories at depth r, for r in ``settings.depths`` and K in
    ``settings.width["widths"]`` with r * K within its compute, on its tier."""
    width = settings.width
    options = settings.tiers.get(width["tier"], {}) if width["tier"] else {}
    cells = []
    for k in width["widths"]:
        depths = [d for d in settings.depths if d * k <= width["compute"]]
        if not depths:
            continue
        log(f"{name}: width {k} at depths {', '.join(map(str, depths))}")
        report = evaluate_lm(
            folder,
            depths,
            limit=width["limit"],
            init_scale=width["init_scale"],
            samples=k,
            write=False,
            task_options=options,
        )
        cells += [{"samples": k, **r} for r in report["results"]]
    return {**width, "cells": cells}


def _depth_table(rows: list[dict[str, Any]], key: str, title: str) -> list[str]:
    """One Markdown table of ``row[key]`` (depth -> value) per model and tier, under ``title``."""
    depths = sorted({d for r in rows for d in r[key]})
    tiered = any(r["tier"] is not None for r in rows)
    lines = [
        "",
        title + (", one row per held-out tier" if tiered else "") + ":",
        "",
        "| model | parameters | trained (min / steps) | "
        + ("tier | " if tiered else "")
        + " | ".join(f"r={d}" for d in depths)
        + " |",
        "|---|---|---|" + ("---|" if tiered else "") + "---|" * len(depths),
    ]
    for r in rows:
        values = r[key]
        cells = [
            "-"
            if values.get(d) is None
            else (
                percent(values[d]) if key != "by_depth" or r["metric"] != "perplexity" else f"{values[d]:.2f}"
            )
            for d in depths
        ]
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['steps']} | "
            + (f"{r['tier']} | " if tiered else "")
            + " | ".join(cells)
            + " |"
        )
    return lines


def _width_table(model: str, width: dict[str, Any]) -> list[str]:
    """The depth x width grid as Markdown: majority-vote exact match by width K (rows) and depth r (columns),
    then the best cell at each compute r * K."""
    cells = width["cells"]
    depths = sorted({c["num_steps"] for c in cells})
    by = {(c["samples"], c["num_steps"]): c for c in cells}
    tier = f" on tier {width['tier']}" if width.get("tier") else ""
    lines = [
        f"{model}: depth x width{tier} ({cells[0]['n']} problems; K latent trajectories from random initial "
        f"states, scale {width['init_scale']:g}, answered by majority vote; r * K up to {width['compute']:g}):",
        "",
        "| width K | " + " | ".join(f"r={d}" for d in depths) + " |",
        "|---|" + "---|" * len(depths),
    ]
    for k in sorted({c["samples"] for c in cells}):
        lines.append(
            f"| {k} | "
            + " | ".join(percent(by[k, d]["exact_match"]) if (k, d) in by else "-" for d in depths)
            + " |"
        )
    best = []
    for compute in sorted({c["samples"] * c["num_steps"] for c in cells}):
        at = [c for c in cells if c["samples"] * c["num_steps"] == compute]
        top = max(at, key=lambda c: (c["exact_match"], -c["samples"]))
        best.append(f"{compute:g}: r={top['num_steps']} K={top['samples']} ({percent(top['exact_match'])})")
    return [*lines, "", "Best at equal compute r * K: " + "; ".join(best) + "."]
