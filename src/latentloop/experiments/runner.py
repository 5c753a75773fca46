"""Running an experiment: train every model on its schedule, have the experiment's kind evaluate each, and
write the results and the report into the output folder.

Each step stores what it produced in the model's folder (``train.json``, and what the kind measures:
``eval.json``, ``sample.json``, ``curve.json``), so a rerun resumes an interrupted run and skips what has
finished with the same settings. A rerun that finds everything finished only renders the results and the
report again (after a change to the report, say), and they keep the date, machine and side-by-side setting
of the run that measured them.

The paths written into these files and ``results.json`` are relative, so the files read the same on any
machine: a run's own files (``run``, ``checkpoint``, ``written``, ``image``, a fitted value head's ``file``)
relative to the output folder (``gram/checkpoints/step_00000100``), a model's run config relative to the
experiment file (``../nqueens8-gram.yaml``, as the file names it), and the experiment file as
``configs/experiments/NAME.yaml`` when it ships with latentloop (else relative to the working directory).

The steps live beside this module: :mod:`~latentloop.experiments.training` (run configs, schedules, one
model trained), :mod:`~latentloop.experiments.kinds` (what each kind evaluates and reports),
:mod:`~latentloop.experiments.store` (the files each step keeps), :mod:`~latentloop.experiments.workers`
(models side by side in worker processes) and :mod:`~latentloop.experiments.aggregation` (the results).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from latentloop.errors import UsageError
from latentloop.experiments.aggregation import collect_results
from latentloop.experiments.kinds import get_kind
from latentloop.experiments.report import plot_examples, plot_results, report_markdown
from latentloop.experiments.spec import Experiment, ModelSpec, positive_number
from latentloop.experiments.store import read_json, write_json
from latentloop.experiments.training import (
    check_run_configs,
    planned_steps,
    relative_config,
    scale_schedules,
    train_model,
)
from latentloop.experiments.workers import run_side_by_side, threads_per_job, torch_threads
from latentloop.io import atomic_write_text

# The run's API: planned_steps and scale_schedules are the training module's, and the command line shortens an
# experiment's schedules through this module.
__all__ = ["model_row", "planned_steps", "run_experiment", "scale_schedules"]


def _measurements(out: Path, specs: list[ModelSpec]) -> dict[str, dict[str, str]]:
    """The records each model's folder holds (``train.json``, ``eval.json``, ...), by model and file name: equal
    before and after a run when it trained and evaluated nothing."""
    return {
        spec.name: {path.name: path.read_text() for path in sorted((out / spec.name).glob("*.json"))}
        for spec in specs
    }


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"cannot write to output folder {out}: {error.strerror or error}") from None


def model_row(
    experiment: Experiment,
    index: int,
    spec: ModelSpec,
    out: Path,
    minutes: float | None,
    progress: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train model ``index`` of ``experiment`` (``spec``, as its kind trains it) into ``out / spec.name`` and
    have the kind evaluate it: its row of the results."""
    kind = get_kind(experiment.kind)
    folder = out / spec.name
    trained = train_model(
        spec,
        folder,
        minutes,
        progress,
        log,
        runs=kind.runs,
        config_name=relative_config(spec.config, experiment),
        experiment_minutes=experiment.expected_minutes,
    )
    return kind.evaluate(experiment, index, spec, folder, trained, progress, log)


def run_experiment(
    experiment: Experiment,
    out: str | Path,
    budget_minutes: float | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train and evaluate every model of ``experiment`` into ``out``; returns the results (also written).

    Every model trains its config's fixed schedule (``train.steps``), so the results do not depend on the
    machine's speed. ``budget_minutes`` caps the training time of the whole experiment, split equally between its
    models (by default the experiment's own ``budget_minutes`` per model, if it sets one): a model the cap stops
    is reported as time-capped, N of its M planned steps. The experiment's kind
    (:mod:`latentloop.experiments.kinds`) decides the runs, what is measured on each and what the results and
    the report hold; with ``experiment.jobs`` above 1 the models train side by side
    (:func:`latentloop.experiments.workers.run_side_by_side`), each on ``experiment.threads_per_model`` torch
    threads (by default an equal share of this process's).
    """
    out = Path(out)
    kind = get_kind(experiment.kind)
    if budget_minutes is not None:
        per_model = positive_number(budget_minutes, "--budget-minutes") / len(experiment.models)
    else:
        per_model = experiment.budget_minutes
    minutes = None if per_model is None else round(per_model, 4)
    check_run_configs(experiment, minutes)
    _check_writable(out)
    jobs = min(experiment.jobs, len(experiment.models))
    started = datetime.datetime.now(datetime.timezone.utc)
    threads = experiment.threads_per_model or threads_per_job(jobs)
    specs = kind.trained_specs(experiment)
    before = _measurements(out, specs)
    if jobs == 1:
        with torch_threads(threads):
            rows = {
                spec.name: model_row(experiment, index, spec, out, minutes, progress, log)
                for index, spec in enumerate(specs)
            }
    else:
        calls = {spec.name: (experiment, index, spec, out, minutes) for index, spec in enumerate(specs)}
        rows = run_side_by_side(model_row, calls, jobs, threads)
    results = collect_results(experiment, kind, rows, started, minutes, jobs, threads)
    previous = read_json(out / "results.json")
    if previous is not None and _measurements(out, specs) == before:
        # Nothing was trained or evaluated here, only rendered: the numbers keep the date, machine and
        # side-by-side setting that measured them.
        kept = ("date", "machine", "jobs", "threads_per_model")
        results |= {key: previous[key] for key in kept if key in previous}
    write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report_markdown(results))
    plot_results(results, out / "curves.png")
    plot_examples(results, out)
    return results
