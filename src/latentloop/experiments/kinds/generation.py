"""``kind: generation``: reasoners trained on a task with a blank puzzle (digits, Sudoku) draw ``eval.samples``
unconditional samples each (``latentloop sample``): their validity, and for digits the classifier's scores
beside real held-out digits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from latentloop.eval.generation import sample_run
from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.experiments.report import (
    percent,
    report_end,
    report_heading,
    save_figure,
)
from latentloop.experiments.spec import EvalSpec, Experiment, ModelSpec
from latentloop.experiments.store import portable, read_json, write_json
from latentloop.plotting import pyplot


class GenerationKind(ExperimentKind):
    """Unconditional samples of each model, at its own default depth unless its own overrides or the
    command line's set ``eval.steps``. Options: ``eval.samples``, ``seed``, ``temperature`` (``eval.steps``
    only as an override: ``overrides: [eval.steps=128, eval.temperature=0.5]``)."""

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
        """The model's row: its training summary and its samples judged (``sample.json``)."""
        settings = experiment.eval_for(spec)
        steps = settings.steps if experiment.evaluation_sets(spec, "steps") else None
        return {"train": trained, "eval": sample_model(spec, folder, settings, steps, log)}

    def summary_rows(self, results: dict[str, Any]) -> list[dict[str, Any]]:
        """Each model's size, training, sampling speed, valid and distinct samples, and scores."""
        rows = []
        for name, row in results["models"].items():
            report, scores = row["eval"], row["eval"].get("scores", {})
            rows.append(
                {
                    "model": name,
                    "parameters": row["train"]["parameters"],
                    "train_minutes": row["train"]["train_minutes"],
                    "batches": row["train"]["step"],
                    "samples": report["samples"],
                    "steps": report["steps"],
                    "temperature": report.get("temperature"),
                    "samples_per_s": report["samples_per_s"],
                    "valid_fraction": report["valid_fraction"],
                    "distinct": report["distinct"],
                    "inception_score": scores.get("inception_score"),
                    "frechet_distance": scores.get("frechet_distance"),
                }
            )
        return rows

    def report_markdown(self, results: dict[str, Any], command: str | None) -> str:
        """The table of samples (beside real held-out digits where scored) and where the grids are."""
        rows = self.summary_rows(results)
        details = f"; {rows[0]['samples']} samples per model, seed {results['eval'].get('seed', 0)}"
        lines = report_heading(results, details, command)
        scored = any(r["inception_score"] is not None for r in rows)
        header = "| model | parameters | trained (min / batches) | steps | temperature | samples/s | valid (%) | distinct |"
        rule = "|---|---|---|---|---|---|---|---|"
        if scored:
            header, rule = header + " inception score | Fréchet distance |", rule + "---|---|"
        lines += ["", header, rule]
        for r in rows:
            # The deterministic reasoners decode argmax: they have no temperature.
            temperature = "-" if r["temperature"] is None else f"{r['temperature']:g}"
            line = (
                f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['batches']} | {r['steps']} | "
                f"{temperature} | "
                f"{r['samples_per_s']:.1f} | {percent(r['valid_fraction'])} | {r['distinct']} |"
            )
            if scored:
                line += f" {_number(r['inception_score'])} | {_number(r['frechet_distance'])} |"
            lines.append(line)
        reference = next(
            (row["eval"]["reference"] for row in results["models"].values() if "reference" in row["eval"]),
            None,
        )
        if reference is not None:
            lines.append(
                f"| real held-out digits ({reference['images']}) | - | - | - | - | - | - | - | "
                f"{_number(reference['inception_score'])} | {_number(reference['frechet_distance'])} |"
            )
        pictures = [
            f"`{name}/samples.png`" for name, row in results["models"].items() if "image" in row["eval"]
        ]
        if pictures:
            lines += ["", "Samples: " + ", ".join(pictures) + "."]
        return report_end(lines, results)

    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        """Each model's valid samples, sampling speed and scores."""
        lines = []
        for row in self.summary_rows(results):
            scores = "  ".join(
                f"{key.replace('_', ' ')} {row[key]:.2f}"
                for key in ("inception_score", "frechet_distance")
                if row[key] is not None
            )
            lines.append(
                f"{row['model']:<8} {row['parameters']:>9,}  valid {100 * row['valid_fraction']:.1f}%"
                f"  {row['samples_per_s']:.1f} samples/s  {scores}"
            )
        return lines

    def plot(self, results: dict[str, Any], path: Path) -> None:
        """The models' sample grids side by side (nothing when none drew one)."""
        # An image is named relative to the output folder (where ``path`` goes), or by older results as given.
        grids = [(name, row["eval"].get("image")) for name, row in results["models"].items()]
        grids = [
            (name, path.parent / image if (path.parent / image).is_file() else Path(image))
            for name, image in grids
            if image
        ]
        grids = [(name, image) for name, image in grids if image.is_file()]
        if not grids:
            return
        plt = pyplot()
        fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 4.4), squeeze=False)
        for ax, (name, image) in zip(axes[0], grids, strict=True):
            ax.imshow(plt.imread(image))
            ax.set_title(name)
            ax.axis("off")
        save_figure(fig, path)


def sample_model(
    spec: ModelSpec, folder: Path, settings: EvalSpec, steps: int | None, log: Callable[[str], None]
) -> dict:
    """``settings.samples`` unconditional samples of the run at ``steps`` (None: its own default depth),
    judged and, for digits, scored; the grid goes to ``MODEL/samples.png``. Stored as the run's
    ``sample.json``, which a rerun with the same settings reads back."""
    report = read_json(folder / "sample.json")
    if (
        report is not None
        and report.get("samples") == settings.samples
        and report.get("temperature", 1.0) == settings.temperature
        and report.get("seed", 0) == settings.seed
        and (steps is None or report.get("steps") == steps)
    ):
        log(f"{spec.name}: sampled already, skipping")
        return report  # written by portable(): its paths are relative to the output folder already
    log(f"{spec.name}: drawing {settings.samples} unconditional samples")
    # images: MODEL/samples.png
    report = sample_run(folder, settings.samples, steps, settings.seed, settings.temperature, 256, None, None)
    report = portable(report, folder.parent)
    write_json(folder / "sample.json", report)
    return report


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
