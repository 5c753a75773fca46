"""latentloop CLI: ``run``, the shipped experiments end to end (train, evaluate, report)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

from latentloop.cli.app import app
from latentloop.errors import UsageError
from latentloop.experiments.results_page import regenerate, write_results

# The options of `latentloop run` whose help takes more than a line.
_OVERRIDES = typer.Argument(
    None,
    help="KEY=VALUE changes for this run: `model.`, `train.` and `task.` keys apply to every model "
    "(`train.seed=1`, `train.compile=true`), `eval.` keys to the evaluation (`eval.samples=5`).",
    show_default=False,
)
_BUDGET = typer.Option(
    None,
    "--budget-minutes",
    help="Cap the training time of the whole experiment, split between its models. A model the cap stops "
    "is reported as time-capped (N of M planned steps), not as the experiment's result.",
)
_JOBS = typer.Option(
    None,
    "--jobs",
    min=1,
    help="Models trained at once, each in its own process (default: the experiment's jobs).",
)
_THREADS = typer.Option(
    None,
    "--threads",
    min=1,
    help="Torch threads of each model (default: the experiment's threads_per_model). The schedules do not "
    "change with it; the float rounding does only where a model's compiled kernels use every thread "
    "(train.compile_threads=0): then another count gives numbers like another seed's.",
)
_SCHEDULE = typer.Option(
    None,
    "--schedule",
    help="Train this fraction (0-1] of every model's schedule, e.g. 0.6: how much margin a result has.",
)
_DASHBOARD = typer.Option(
    None,
    "--dashboard",
    help="Rewrite the generated blocks of FILE.md from the committed results and exit: the claims dashboard "
    "of docs/RESULTS.md, the headline table of README.md, the generated figures of a topic page.",
)


@app.command("run")
def run_command(
    experiment: str = typer.Argument(
        None, help="A shipped experiment (see --list) or an experiment YAML file."
    ),
    overrides: list[str] = _OVERRIDES,
    out: str = typer.Option(None, "--out", help="Output folder (default: runs/EXPERIMENT)."),
    budget_minutes: str = _BUDGET,
    jobs: int = _JOBS,
    threads: int = _THREADS,
    schedule: str = _SCHEDULE,
    list_only: bool = typer.Option(False, "--list", help="List the shipped experiments and exit."),
    dashboard: str = _DASHBOARD,
    report: str = typer.Option(None, "--report", help="Also write this experiment's section into FILE.md."),
    json_output: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Run an experiment: train its models on their fixed schedules, evaluate depth and width scaling, write a
    report (report.md, results.json, curves.png, boards.png). Running it again resumes and skips finished
    parts. The schedules, and so the numbers, do not depend on the machine's speed; `--list` gives each
    experiment's minutes on the reference machine, and the run says how long it will take on this one once it
    has timed its first batches."""
    from latentloop.experiments import DEFAULT_EXPERIMENT, load_experiment, positive_number

    if list_only:
        _list_experiments()
        return
    if dashboard:
        if not Path(dashboard).is_file():
            raise UsageError(f"--dashboard {dashboard}: no such file")
        changed = regenerate(Path(dashboard))
        typer.echo(f"{'updated' if changed else 'unchanged'} {dashboard}")
        return
    budget = None
    if budget_minutes is not None:
        budget = positive_number(budget_minutes, "--budget-minutes")
    overrides = list(overrides or [])
    if experiment is not None and "=" in experiment:  # `latentloop run train.seed=1`: the default experiment
        experiment, overrides = None, [experiment, *overrides]
    from latentloop.config import check_repeated_keys

    check_repeated_keys(overrides)
    spec = load_experiment(experiment or DEFAULT_EXPERIMENT, overrides)
    if jobs is not None:
        spec.jobs = jobs
    if schedule is not None:
        from latentloop.experiments.runner import scale_schedules

        spec = scale_schedules(spec, positive_number(schedule, "--schedule"))
    if threads is not None:
        spec.threads_per_model = threads
    out_dir = Path(out) if out else Path("runs") / spec.name

    from latentloop.experiments.report import report_markdown
    from latentloop.experiments.runner import run_experiment

    results = run_experiment(spec, out_dir, budget_minutes=budget, progress=not json_output, log=_log)
    if report:
        words = ["latentloop", "run", experiment or spec.name, *overrides]
        given = {"--out": out_dir, "--report": report, "--budget-minutes": budget and f"{budget:g}"}
        given |= {"--jobs": jobs, "--threads": threads}
        for option, value in {**given, "--schedule": schedule}.items():
            words += [option, str(value)] if value is not None else []
        command = " ".join(shlex.quote(w) for w in words)
        write_results(Path(report), (spec.name, report_markdown(results, command)))
    if json_output:
        typer.echo(json.dumps(results))
        return
    for line in summary_lines(results):
        typer.echo(line)
    typer.echo(f"report: {out_dir / 'report.md'}")
    if report:
        typer.echo(f"updated {report}")


def summary_lines(results: dict) -> list[str]:
    """The summary table printed after a run, one line per model (its shape depends on the experiment's kind)."""
    from latentloop.experiments.report import summary_lines as lines_of

    return lines_of(results)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _list_experiments() -> None:
    """``latentloop run --list``: each shipped experiment, its minutes on the reference machine, its summary."""
    from latentloop.experiments import REFERENCE_MACHINE, available_experiments, load_experiment

    names = available_experiments()
    width = max(map(len, names), default=0)
    typer.echo(f"minutes on the reference machine: {REFERENCE_MACHINE}", err=True)
    for name in names:
        spec = load_experiment(name)
        minutes = f"~{spec.expected_minutes:g} min" if spec.expected_minutes else ""
        summary = spec.description.splitlines()[0] if spec.description else ""
        typer.echo(f"{name:<{width}} {minutes:>9}  {summary}")
