"""Running an experiment: train every model under its budget, evaluate (or sample) each alike, and write the
results and the report into the output folder.

Each step stores what it produced in the model's folder (``train.json``, ``eval.json``, ``sample.json``), so a
rerun resumes an interrupted run and skips what has finished with the same settings.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from latentloop.config import load_yaml
from latentloop.errors import UsageError
from latentloop.eval.generation import sample_run
from latentloop.eval.lm import evaluate_lm
from latentloop.eval.reasoners import evaluate_reasoner, load_run, run_dataset
from latentloop.experiments.report import plot_example_boards, plot_results, report_markdown
from latentloop.experiments.spec import EvalSpec, Experiment, ModelSpec, positive_number
from latentloop.io import atomic_write_text
from latentloop.models.reasoners import REASONERS
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config, build_run_config
from latentloop.train.value import fit_value_head, save_value_head


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"cannot write to output folder {out}: {error.strerror or error}") from None


def _check_run_configs(experiment: Experiment) -> None:
    """Build every model's run config with its overrides, so that a bad key or value stops the experiment
    before any model trains."""
    build = build_run_config if experiment.kind == "lm" else build_reasoner_config
    for spec in experiment.models:
        build(load_yaml(spec.config), spec.overrides)


def _train_model(
    spec: ModelSpec,
    folder: Path,
    minutes: float,
    progress: bool,
    log: Callable[[str], None],
    lm: bool = False,
) -> dict[str, Any]:
    """Train (or resume) one model (a reasoner, or with ``lm`` a recurrent-depth LM); its summary is stored in
    ``train.json`` once training has finished, and a rerun with the same budget returns it untrained."""
    done = _read_json(folder / "train.json")
    if done is not None and done.get("overrides", []) != spec.overrides:
        raise UsageError(
            f"{folder} was trained with overrides {done.get('overrides', [])}, not {spec.overrides}; "
            "use another --out"
        )
    if done is not None and done.get("budget_minutes") == minutes:
        log(f"{spec.name}: trained already ({done['step']} steps), skipping")
        return done
    overrides = [*spec.overrides, f"train.budget_minutes={minutes}"]
    log(f"{spec.name}: training for up to {minutes:g} min in {folder}")
    if lm:
        config = build_run_config(load_yaml(spec.config), overrides)
        result = train(config, folder, progress=progress)
        with torch.device("meta"):  # the count only: no weights drawn
            parameters = RecurrentDepthLM(config.model).num_parameters()
        arch, seen = config.arch, {"tokens_seen": result.counts["tokens_seen"]}
    else:
        config = build_reasoner_config(load_yaml(spec.config), overrides)
        result = train(config, folder, progress=spec.name if progress else False, log=None)
        parameters, arch = result.counts["parameters"], config.arch
        seen = {"examples_seen": result.counts["examples_seen"]}
    summary = {
        "model": spec.name,
        "arch": arch,
        "config": str(spec.config),
        "overrides": spec.overrides,
        "budget_minutes": minutes,
        "parameters": parameters,
        "step": result.step,
        "stopped": result.stopped,
        **seen,
        "train_minutes": round(result.elapsed_s / 60, 2),
        "precision": result.precision,
        "final_loss": result.losses[-1] if result.losses else None,
    }
    _write_json(folder / "train.json", summary)
    return summary


def _evaluate_lm(spec: ModelSpec, folder: Path, settings: EvalSpec, log: Callable[[str], None]) -> dict:
    """The held-out metric at each depth of ``settings.depths`` (also written as the run's eval files)."""
    report = _read_json(folder / "eval.json")
    if (
        report is not None
        and [r["num_steps"] for r in report.get("results", [])] == settings.depths
        and report.get("limit") == settings.limit
    ):
        log(f"{spec.name}: evaluated already, skipping")
        return report
    log(f"{spec.name}: evaluating at depths {', '.join(map(str, settings.depths))}")
    report = evaluate_lm(folder, settings.depths, limit=settings.limit)
    report["limit"] = settings.limit
    _write_json(folder / "eval.json", report)
    return report


def _sample_model(spec: ModelSpec, folder: Path, settings: EvalSpec, log: Callable[[str], None]) -> dict:
    """``settings.samples`` unconditional samples of the run (its own default depth), judged and, for digits,
    scored; the grid goes to ``MODEL/samples.png``."""
    report = _read_json(folder / "sample.json")
    if (
        report is not None
        and report.get("samples") == settings.samples
        and report.get("temperature", 1.0) == settings.temperature
    ):
        log(f"{spec.name}: sampled already, skipping")
        return report
    log(f"{spec.name}: drawing {settings.samples} unconditional samples")
    # images: MODEL/samples.png
    report = sample_run(folder, settings.samples, None, 0, settings.temperature, 256, None, None)
    _write_json(folder / "sample.json", report)
    return report


def _evaluate_model(
    spec: ModelSpec,
    folder: Path,
    arch: str,
    settings: EvalSpec,
    log: Callable[[str], None],
    progress: bool = True,
) -> dict:
    # The generative baselines decode with their own loop (AR: one pass; MDLM: its unmasking steps), so the
    # experiment's supervision-step count does not apply to them: they use their own default.
    steps = None if REASONERS[arch].generative else settings.steps
    fit_steps = settings.fit_value if REASONERS[arch].stochastic and not REASONERS[arch].generative else 0
    wanted = {"samples": settings.samples, "select": settings.select, "seed": settings.seed}
    report = _read_json(folder / "eval.json")
    if (
        report is not None
        and all(report.get(k) == v for k, v in wanted.items())
        and report.get("limit") == settings.limit
        and report.get("temperature", 1.0) == settings.temperature
        and report.get("requested_steps", report.get("steps")) == steps
        and report.get("value_fit", {}).get("steps", 0) == fit_steps
    ):
        log(f"{spec.name}: evaluated already, skipping")
        return report
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
    )
    report["limit"], report["requested_steps"] = settings.limit, steps
    if value_fit is not None:
        report["value_fit"] = value_fit
    _write_json(folder / "eval.json", report)
    return report


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


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def run_experiment(
    experiment: Experiment,
    out: str | Path,
    budget_minutes: float | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train and evaluate every model of ``experiment`` into ``out``; returns the results (also written).

    ``budget_minutes`` is the training time of the whole experiment, split equally between its models; by
    default each model gets the experiment's ``budget_minutes``.
    """
    out = Path(out)
    _check_run_configs(experiment)
    if budget_minutes is not None:
        per_model = positive_number(budget_minutes, "--budget-minutes") / len(experiment.models)
    else:
        per_model = experiment.budget_minutes
    _check_writable(out)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows: dict[str, Any] = {}
    for spec in experiment.models:
        folder = out / spec.name
        train = _train_model(spec, folder, round(per_model, 4), progress, log, lm=experiment.kind == "lm")
        if experiment.kind == "lm":
            report = _evaluate_lm(spec, folder, experiment.eval, log)
        elif experiment.kind == "generation":
            report = _sample_model(spec, folder, experiment.eval, log)
        else:
            report = _evaluate_model(spec, folder, train["arch"], experiment.eval, log, progress)
        rows[spec.name] = {"train": train, "eval": report}
    results = {
        "experiment": experiment.name,
        "kind": experiment.kind,
        "description": experiment.description,
        "file": str(experiment.path),
        "date": started.strftime("%Y-%m-%d"),
        "machine": machine(),
        "budget_minutes_per_model": round(per_model, 4),
        "overrides": experiment.overrides,
        "eval": vars(experiment.eval),
        "models": rows,
        "paper": experiment.paper,
        "paper_note": experiment.paper_note,
    }
    _write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report_markdown(results))
    plot_results(results, out / "curves.png")
    if experiment.kind == "reasoners":
        plot_example_boards(results, out)
    return results
