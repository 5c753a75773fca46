"""latentloop CLI: ``sample``, unconditional samples of a trained puzzle reasoner (digits pictures, Sudoku boards)."""

from __future__ import annotations

import json
from typing import Any

import typer

from latentloop.cli.app import TEMPERATURE, app
from latentloop.errors import UsageError

_STEP_NAMES = {"mdlm": "unmasking steps", "ar": "left-to-right pass"}


def _human(report: dict[str, Any]) -> str:
    """A short summary: speed, validity, and for digits the scores beside real held-out digits'."""
    steps = _STEP_NAMES.get(report["model"], "supervision steps")
    lines = [
        f"{report['samples']} unconditional {report['task']} samples from {report['checkpoint']} "
        f"({report['model']}, {report['steps']} {steps}, seed {report['seed']}): "
        f"{report['elapsed_s']:.2f} s, {report['samples_per_s']:.1f} samples/s",
        f"valid by the task's verifier: {report['valid']}/{report['samples']} "
        f"({100 * report['valid_fraction']:.1f}%), {report['distinct']} distinct",
    ]
    if "scores" in report:
        ours, real = report["scores"], report["reference"]

        def cell(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        lines += [
            f"{'':18}{'samples':>10}{'real held-out (' + str(real['images']) + ')':>22}",
            f"{'inception score':18}{cell(ours['inception_score']):>10}{cell(real['inception_score']):>22}",
            f"{'Fréchet distance':18}{cell(ours['frechet_distance']):>10}{cell(real['frechet_distance']):>22}",
            f"classifier test accuracy: {100 * ours['classifier_test_accuracy']:.1f}%",
        ]
    elif "scores_skipped" in report:
        lines.append(f"no scores: {report['scores_skipped']}")
    lines += report.get("examples", [])
    if "image" in report:
        lines.append(f"wrote {report['image']}")
    return "\n".join(lines)


@app.command("sample")
def sample(
    run: str = typer.Argument(..., help="Run folder (its newest checkpoint) or checkpoint folder."),
    n: int = typer.Option(64, "--n", help="Number of samples."),
    steps: int = typer.Option(
        None, "--steps", help="Supervision steps (mdlm: unmasking steps; default: the model's own)."
    ),
    out: str = typer.Option(
        None, "--out", "-o", help="PNG grid of the samples (image tasks; default RUN/samples.png)."
    ),
    seed: int = typer.Option(
        0, "--seed", help="Seed of the sampling noise: the same seed, the same samples."
    ),
    temperature: float = TEMPERATURE,
    batch_size: int = typer.Option(256, "--batch-size", help="Samples per batched forward pass."),
    task: str = typer.Option(None, "--task", help="Task spec, needed only for a checkpoint outside a run."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Sample answers to the task's blank puzzle (unconditional generation) and judge them: the fraction the
    task's verifier accepts (Sudoku: valid complete boards) and, for digits, an Inception-Score-like figure and
    a Fréchet distance beside those of real held-out digits; digits samples are drawn as a PNG grid."""
    from latentloop.eval.generation import sample_run
    from latentloop.families import REASONER, checkpoint_model_type

    if n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    kind = checkpoint_model_type(run)
    if not REASONER.owns_model_type(kind):
        raise UsageError(f"{run}: sample needs a puzzle reasoner run, this checkpoint is {kind!r}")
    report = sample_run(run, n, steps, seed, temperature, batch_size, out, task)
    typer.echo(json.dumps(report) if json_output else _human(report))
