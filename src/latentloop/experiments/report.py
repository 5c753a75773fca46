"""Reporting an experiment from its ``results.json``: the summary rows, the Markdown report, the curves and
the example pictures, each made by the experiment's kind (:mod:`latentloop.experiments.kinds`); and the pieces
the kinds' reports share.

Every number shown comes from the results, so a report can be rewritten later without running anything again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latentloop.experiments.kinds import DEFAULT_KIND, get_kind
from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.plotting import save_png


def results_kind(results: dict[str, Any]) -> ExperimentKind:
    """The kind that made ``results`` (results that name none were written before there were other kinds)."""
    return get_kind(results.get("kind", DEFAULT_KIND))


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per model (per model and tier for ``kind: lm``): the headline numbers of the table."""
    return results_kind(results).summary_rows(results)


def report_markdown(results: dict[str, Any], command: str | None = None) -> str:
    """The experiment's table (ours beside the paper's) and its curves as Markdown; ``command``, the one that
    reproduces it, is shown when given."""
    return results_kind(results).report_markdown(results, command)


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The summary table printed after a run, one line per row (its shape depends on the experiment's kind)."""
    return results_kind(results).summary_lines(results)


def plot_results(results: dict[str, Any], path: Path) -> None:
    """The experiment's curves (``curves.png``) drawn into ``path``."""
    results_kind(results).plot(results, path)


def plot_examples(results: dict[str, Any], out: Path) -> None:
    """Pictures of the models' answers in the output folder ``out``, for the kinds that draw them
    (``boards.png``)."""
    results_kind(results).draw_examples(results, out)


# The pieces the kinds' reports share -----------------------------------------------------------------------------


def percent(value: float | None) -> str:
    """A fraction as a percent with one decimal (``-`` when unknown)."""
    return "-" if value is None else f"{100 * value:.1f}"


def format_flops(value: float | None) -> str:
    """FLOPs as ``1.23e14`` (``-`` when unknown)."""
    if value is None:
        return "-"
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def schedule_sentence(results: dict[str, Any]) -> str:
    """How much each model trained, as the report's heading says it: the fixed schedules (the same on any
    machine), or under a time cap "time-capped: N of M planned steps" for each model the cap stopped, which is
    then not the experiment's reference result. Results written before schedules were fixed (no
    ``planned_steps``) trained for a wall-clock budget and say so."""
    trained = {name: row["train"] for name, row in results["models"].items()}
    if not all("planned_steps" in t for t in trained.values()):
        minutes = results.get("budget_minutes_per_model")
        return f"training budget {minutes:g} min of wall-clock per model (a schedule fitted to the minutes)"
    steps = ", ".join(f"{name} {t['planned_steps']:,}" for name, t in trained.items())
    capped = {name: t for name, t in trained.items() if t.get("time_capped")}
    fraction = results.get("schedule_fraction", 1.0)
    share = "" if fraction == 1 else f" at {100 * fraction:g}% of the experiment's"
    if not capped:
        return f"fixed schedules{share}, the same on any machine: {steps} steps"
    stopped = ", ".join(
        f"{name} {t['step']:,} of {t['planned_steps']:,} planned steps" for name, t in capped.items()
    )
    return (
        f"time-capped at {results['budget_minutes_per_model']:g} min per model: {stopped} "
        f"(not the reference result; planned: {steps} steps)"
    )


def parts_sentence(results: dict[str, Any]) -> str:
    """Where some models were trained on another date or CPU than the run that wrote ``results`` (a table
    assembled in parts): which models, when and where; empty when all were trained by that run."""
    own = (results["date"], results["machine"].get("cpu"))
    trains = {name: row["train"] for name, row in results["models"].items()}
    if not any("date" in train for train in trains.values()):
        return ""  # written before models recorded where they trained: one run, as far as anyone can tell
    groups: dict[tuple[str | None, str | None], list[str]] = {}
    for name, train in trains.items():
        # A record without a date was written before records had one: an earlier run than this one.
        groups.setdefault((train.get("date"), train.get("cpu")), []).append(name)
    if list(groups) == [own]:
        return ""
    parts = "; ".join(
        f"{', '.join(names)} on {date} ({cpu or 'CPU not recorded'})"
        if date
        else f"{', '.join(names)} in an earlier run (date and CPU not recorded)"
        for (date, cpu), names in groups.items()
    )
    return f" Trained in parts: {parts}."


def report_heading(results: dict[str, Any], details: str, command: str | None) -> list[str]:
    """The lines every report starts with: title, description, where and how it was measured (``details``
    ends that sentence), the command."""
    machine_ = results["machine"]
    jobs, threads = results.get("jobs", 1), results.get("threads_per_model")
    # The threads per model may decide the float rounding (train.compile_threads), so the report names them.
    together = ""
    if threads and jobs > 1:
        together = f" ({jobs} models at a time, {threads} thread{'s' * (threads > 1)} each)"
    elif threads:
        together = f" ({threads} thread{'s' * (threads > 1)} per model)"
    cpu = f"{machine_['cpu']}, " if machine_.get("cpu") else ""
    lines = [
        f"## {results['experiment']}",
        "",
        results["description"],
        "",
        f"Measured on {results['date']} ({cpu}{machine_['cpus']} CPUs, torch {machine_['torch']}, "
        f"{machine_['device']}); {schedule_sentence(results)}{together}{details}.{parts_sentence(results)}",
    ]
    return lines + (["", f"Command: `{command}`"] if command else [])


def temperature_details(evaluation: dict[str, Any]) -> str:
    """The heading's mention of a sampling temperature other than 1 (nothing at 1)."""
    if evaluation.get("temperature", 1.0) != 1.0:
        return f", sampling temperature {evaluation['temperature']}"
    return ""


def report_end(lines: list[str], results: dict[str, Any]) -> str:
    """The report of ``lines``, closed by the experiment's note on the paper when it has one."""
    if results.get("paper_note"):
        lines = [*lines, "", results["paper_note"]]
    return "\n".join(lines) + "\n"


def accuracy_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The summary printed after a puzzle experiment: each model's accuracies (one sample, vote, value head)
    and coverage."""
    lines = [f"{'model':<8} {'params':>9} {'acc@1':>7} {'vote':>7} {'value':>7} {'coverage':>9}"]
    for row in rows:
        cells = [row["accuracy_1_sample"], row["accuracy_vote"], row["accuracy_value"], row["coverage"]]
        text = [("-" if c is None else f"{100 * c:.1f}") for c in cells]
        lines.append(
            f"{row['model']:<8} {row['parameters']:>9,} {text[0]:>7} {text[1]:>7} {text[2]:>7} {text[3]:>9}"
        )
    return lines


def save_figure(fig: Any, path: Path) -> None:
    """Lay ``fig`` out and write it to ``path`` as a PNG (atomically), then close it."""
    fig.tight_layout()
    save_png(fig, path, dpi=110)
