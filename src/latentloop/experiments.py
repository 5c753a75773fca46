"""Shipped experiments: train several reasoners on one task under one budget, evaluate them alike, report.

An experiment is a YAML file in ``configs/experiments/``::

    description: N-Queens 8x8 under the GRAM protocol ...
    budget_minutes: 10          # training wall-clock per model (``--budget-minutes`` sets the total instead)
    models:                     # name -> run config (relative to this file) and key=value overrides
      gram: {config: ../nqueens8-gram.yaml}
      trm: {config: ../nqueens8-trm.yaml, overrides: [train.lr=5e-4]}
    eval: {samples: 20, steps: 16, limit: 200}
    paper: {gram: {accuracy: 99.7, coverage: 90.3}}   # the paper's numbers, shown beside ours

An experiment with ``kind: lm`` trains recurrent-depth language models instead and evaluates each at the
test-time depths ``eval.depths`` (``eval: {depths: [1, 2, 4, 8, 16, 32], limit: 1000}``). One with
``kind: generation`` trains reasoners on a task with a blank puzzle (digits, Sudoku) and draws
``eval.samples`` unconditional samples from each (``latentloop sample``): validity, and for digits the
classifier scores beside real held-out digits.

:func:`run_experiment` trains each model in ``OUT/<model>`` (resuming an interrupted run; a finished run is not
trained again), evaluates it on the test split with depth (steps ``1..steps``) and width (samples
``1..samples``) curves, and writes ``results.json``, ``report.md``, ``curves.png`` and (tasks that draw
their answers) ``boards.png`` in ``OUT``. Every number in the report comes from ``results.json``, which in
turn holds each run's ``eval.json``. ``key=value`` overrides given for one run (:func:`load_experiment`) reach
every model's config or the evaluation, and are recorded in ``results.json``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latentloop.config import apply_overrides, load_yaml
from latentloop.errors import UsageError
from latentloop.io import atomic_path, atomic_write_text

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "configs" / "experiments"
DEFAULT_EXPERIMENT = "default"
KINDS = ("reasoners", "lm", "generation")


@dataclass
class ModelSpec:
    """One row of an experiment: a run config and overrides applied on top of it."""

    name: str
    config: Path
    overrides: list[str] = field(default_factory=list)


@dataclass
class EvalSpec:
    """How every model of an experiment is evaluated."""

    samples: int = 20
    steps: int = 16
    limit: int | None = None
    select: str = "vote"
    seed: int = 0  # of the models' sampling noise: a rerun evaluates alike
    temperature: float = 1.0  # AR and MDLM: of their token draws; GRAM: scale of its prior noise
    # GRAM: updates of a value head fitted to its own samples before evaluating (latentloop fit-value); 0: off
    fit_value: int = 0
    depths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # kind: lm only


@dataclass
class Experiment:
    """A parsed experiment file."""

    name: str
    path: Path
    description: str
    budget_minutes: float
    models: list[ModelSpec]
    eval: EvalSpec
    paper: dict[str, dict[str, float]]
    paper_note: str = ""
    expected_minutes: float | None = None
    kind: str = "reasoners"  # "lm": recurrent-depth LMs against depth; "generation": unconditional samples
    overrides: list[str] = field(default_factory=list)  # given for this run (see load_experiment)


def available_experiments(folder: Path = EXPERIMENTS_DIR) -> list[str]:
    """Names of the shipped experiments."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def positive_number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise UsageError(f"{name} must be a positive number, got {value!r}")
    return number


OVERRIDE_SECTIONS = ("model", "train", "task", "eval")


def _split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``key=value`` overrides of an experiment, split into those of every model's run config (``model.``,
    ``train.``, ``task.``) and those of the evaluation (``eval.``, prefix removed)."""
    run, evaluation = [], []
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or key.split(".", 1)[0] not in OVERRIDE_SECTIONS or "." not in key:
            raise UsageError(
                f"override {item!r} is not KEY=VALUE with KEY in {', '.join(s + '.' for s in OVERRIDE_SECTIONS)}"
            )
        if key.startswith("eval."):
            evaluation.append(item.split(".", 1)[1])
        else:
            run.append(item)
    return run, evaluation


def load_experiment(name_or_path: str, overrides: Sequence[str] = ()) -> Experiment:
    """An experiment by shipped name (``nqueens8``) or YAML path, validated with one-line errors.

    ``overrides`` (``key=value``) change it for this run: ``eval.*`` keys the evaluation (``eval.samples=5``),
    ``model.*``, ``train.*`` and ``task.*`` keys every model's run config (``train.seed=1``,
    ``train.compile=true``), after the experiment's own per-model overrides.
    """
    run_overrides, eval_overrides = _split_overrides(overrides)
    path = Path(name_or_path)
    if not path.suffix:
        path = EXPERIMENTS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(available_experiments()) or "none"
            raise UsageError(f"unknown experiment {name_or_path!r} (known: {known})")
    data = load_yaml(path)
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"{path}: 'models' must map model names to {{config: FILE}}")
    specs = []
    for model, entry in models.items():
        if not isinstance(entry, dict) or "config" not in entry:
            raise UsageError(f"{path}: models.{model} needs a 'config' file")
        config = (path.parent / str(entry["config"])).resolve()
        if not config.is_file():
            raise UsageError(f"{path}: models.{model}.config {config} does not exist")
        own = [str(o) for o in entry.get("overrides") or []]
        specs.append(ModelSpec(str(model), config, [*own, *run_overrides]))
    raw_eval = data.get("eval") or {}
    known = {"samples", "steps", "limit", "select", "seed", "temperature", "depths", "fit_value"}
    unknown = set(raw_eval) - known
    if unknown:
        raise UsageError(f"{path}: unknown eval keys {', '.join(sorted(unknown))}")
    try:
        evaluation = apply_overrides(EvalSpec(**raw_eval), eval_overrides)
    except UsageError as error:
        raise UsageError(f"eval override: {error}") from None
    for key in ("samples", "steps"):
        if int(getattr(evaluation, key)) < 1:
            raise UsageError(f"{path}: eval.{key} must be at least 1")
    if not float(evaluation.temperature) >= 0:
        raise UsageError(f"{path}: eval.temperature must be at least 0")
    if int(evaluation.fit_value) < 0:
        raise UsageError(f"{path}: eval.fit_value must be at least 0")
    depths = evaluation.depths
    if not isinstance(depths, list) or not depths or not all(isinstance(d, int) and d >= 1 for d in depths):
        raise UsageError(f"{path}: eval.depths must be a list of positive integers")
    kind = str(data.get("kind", "reasoners"))
    if kind not in KINDS:
        raise UsageError(f"{path}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    expected = data.get("expected_minutes")
    return Experiment(
        name=path.stem,
        path=path,
        description=str(data.get("description", "")).strip(),
        budget_minutes=positive_number(data.get("budget_minutes", 10), f"{path}: budget_minutes"),
        models=specs,
        eval=evaluation,
        paper={str(k): dict(v) for k, v in (data.get("paper") or {}).items()},
        paper_note=str(data.get("paper_note", "")).strip(),
        expected_minutes=float(expected) if expected is not None else None,
        kind=kind,
        overrides=list(overrides),
    )


# Running -------------------------------------------------------------------------------------------------------
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
    from latentloop.train.deep_supervision import build_reasoner_config
    from latentloop.train.trainer import build_run_config

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
        import torch

        from latentloop.models.recurrent_depth import RecurrentDepthLM
        from latentloop.train.trainer import build_run_config, train

        config = build_run_config(load_yaml(spec.config), overrides)
        result = train(config, folder, progress=progress)
        with torch.device("meta"):  # the count only: no weights drawn
            parameters = RecurrentDepthLM(config.model).num_parameters()
        arch, seen = "recurrent-depth", {"tokens_seen": result.tokens_seen}
    else:
        from latentloop.train.deep_supervision import build_reasoner_config, train_reasoner

        config = build_reasoner_config(load_yaml(spec.config), overrides)
        result = train_reasoner(config, folder, progress=spec.name if progress else False, log=None)
        parameters, arch, seen = result.parameters, config.arch, {"examples_seen": result.examples_seen}
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
    from latentloop.eval.lm import evaluate_lm

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
    from latentloop.eval.generation import sample_run

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
    from latentloop.eval.reasoners import evaluate_reasoner
    from latentloop.models.reasoners import REASONERS

    # The generative baselines decode with their own loop (AR: one pass; MDLM: its unmasking steps), so the
    # experiment's supervision-step count does not apply to them: they use their own default.
    steps = None if hasattr(REASONERS[arch], "sample") else settings.steps
    fit_steps = (
        settings.fit_value if REASONERS[arch].stochastic and not hasattr(REASONERS[arch], "sample") else 0
    )
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
    from latentloop.eval.reasoners import load_run, run_dataset
    from latentloop.train.value import fit_value_head, save_value_head

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
    import torch

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
        _plot_example_boards(results, out)
    return results


def _plot_example_boards(results: dict[str, Any], out: Path) -> None:
    """``boards.png``: a few answers of every model (solved ones first), where the task can draw them."""
    from latentloop.eval.reasoners import plot_boards
    from latentloop.tasks.base import get_task
    from latentloop.train.deep_supervision import load_reasoner_run_config

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


# Reporting -----------------------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per model: the headline numbers of the table (for ``kind: lm``, the metric by depth)."""
    if results.get("kind") == "generation":
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
                    "samples_per_s": report["samples_per_s"],
                    "valid_fraction": report["valid_fraction"],
                    "distinct": report["distinct"],
                    "inception_score": scores.get("inception_score"),
                    "frechet_distance": scores.get("frechet_distance"),
                }
            )
        return rows
    if results.get("kind") == "lm":
        return [
            {
                "model": name,
                "parameters": row["train"]["parameters"],
                "train_minutes": row["train"]["train_minutes"],
                "steps": row["train"]["step"],
                "metric": row["eval"]["metric"],
                "by_depth": {r["num_steps"]: r[row["eval"]["metric"]] for r in row["eval"]["results"]},
            }
            for name, row in results["models"].items()
        ]
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
                "accuracy_vote": by_select.get("vote"),
                "accuracy_value": by_select.get("value"),
                "accuracy_1_sample": report["curve_samples"][0]["vote"],
                "coverage": report.get("coverage"),
                "conflicts_total": report.get("conflicts_total"),
            }
        )
    return rows


def _report_heading(results: dict[str, Any], details: str, command: str | None) -> list[str]:
    """The lines every report starts with: title, description, where and how it was measured, the command."""
    machine_ = results["machine"]
    lines = [
        f"## {results['experiment']}",
        "",
        results["description"],
        "",
        f"Measured on {results['date']} ({machine_['cpus']} CPUs, torch {machine_['torch']}, {machine_['device']}); "
        f"training budget {results['budget_minutes_per_model']:g} min of wall-clock per model{details}.",
    ]
    return lines + (["", f"Command: `{command}`"] if command else [])


def _lm_report_markdown(results: dict[str, Any], command: str | None) -> str:
    rows = summary_rows(results)
    depths = sorted({d for r in rows for d in r["by_depth"]})
    lines = _report_heading(results, "", command)
    metric = rows[0]["metric"].replace("_", " ")
    lines += [
        "",
        f"Held-out {metric} against test-time depth (recurrent-core iterations):",
        "",
        "| model | parameters | trained (min / steps) | " + " | ".join(f"r={d}" for d in depths) + " |",
        "|---|---|---|" + "---|" * len(depths),
    ]
    for r in rows:
        cells = [
            "-"
            if r["by_depth"].get(d) is None
            else (_pct(r["by_depth"][d]) if r["metric"] != "perplexity" else f"{r['by_depth'][d]:.2f}")
            for d in depths
        ]
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['steps']} | "
            + " | ".join(cells)
            + " |"
        )
    for name, paper in results["paper"].items():
        lines += ["", f"Paper ({name}): " + "; ".join(f"{k} {v}" for k, v in paper.items())]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def _generation_report_markdown(results: dict[str, Any], command: str | None) -> str:
    rows = summary_rows(results)
    details = f"; {rows[0]['samples']} samples per model at its own default depth"
    if results["eval"].get("temperature", 1.0) != 1.0:
        details += f", sampling temperature {results['eval']['temperature']}"
    lines = _report_heading(results, details, command)
    scored = any(r["inception_score"] is not None for r in rows)
    header = "| model | parameters | trained (min / batches) | samples/s | valid (%) | distinct |"
    rule = "|---|---|---|---|---|---|"
    if scored:
        header, rule = header + " inception score | Fréchet distance |", rule + "---|---|"
    lines += ["", header, rule]

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for r in rows:
        line = (
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['batches']} | "
            f"{r['samples_per_s']:.1f} | {_pct(r['valid_fraction'])} | {r['distinct']} |"
        )
        if scored:
            line += f" {num(r['inception_score'])} | {num(r['frechet_distance'])} |"
        lines.append(line)
    reference = next(
        (row["eval"]["reference"] for row in results["models"].values() if "reference" in row["eval"]), None
    )
    if reference is not None:
        lines.append(
            f"| real held-out digits ({reference['images']}) | - | - | - | - | - | "
            f"{num(reference['inception_score'])} | {num(reference['frechet_distance'])} |"
        )
    pictures = [f"`{name}/samples.png`" for name, row in results["models"].items() if "image" in row["eval"]]
    if pictures:
        lines += ["", "Samples: " + ", ".join(pictures) + "."]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def report_markdown(results: dict[str, Any], command: str | None = None) -> str:
    """The experiment's table (ours beside the paper's) and its curves as Markdown."""
    if results.get("kind") == "lm":
        return _lm_report_markdown(results, command)
    if results.get("kind") == "generation":
        return _generation_report_markdown(results, command)
    ev = results["eval"]
    rows = summary_rows(results)
    has_cov = any(r["coverage"] is not None for r in rows)
    has_conf = any(r["conflicts_total"] is not None for r in rows)
    first = next(iter(results["models"].values()))["eval"]
    details = f"; {first['puzzles']} test puzzles, {ev['samples']} samples, {ev['steps']} steps"
    if ev.get("temperature", 1.0) != 1.0:
        details += f", sampling temperature {ev['temperature']}"
    if first.get("metric"):  # ARC: accuracy is pass@2 over the augmented copies of each test input
        details += f"; accuracy is {first['metric']} over {first['copies']} augmented copies"
    lines = _report_heading(results, details, command)
    header = "| model | parameters | trained (min / batches) | accuracy, 1 sample | accuracy, vote | accuracy, value |"
    rule = "|---|---|---|---|---|---|"
    if has_cov:
        header, rule = header + " coverage |", rule + "---|"
    if has_conf:
        header, rule = header + " conflicts (total) |", rule + "---|"
    if results["paper"]:
        header, rule = header + " paper |", rule + "---|"
    lines += ["", header, rule]
    for r in rows:
        line = (
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['batches']} | "
            f"{_pct(r['accuracy_1_sample'])} | {_pct(r['accuracy_vote'])} | {_pct(r['accuracy_value'])} |"
        )
        if has_cov:
            line += f" {_pct(r['coverage'])} |"
        if has_conf:
            line += " - |" if r["conflicts_total"] is None else f" {r['conflicts_total']} |"
        if results["paper"]:
            paper = results["paper"].get(r["model"], {})
            line += " " + (" / ".join(f"{k} {v:g}" for k, v in paper.items()) or "-") + " |"
        lines.append(line)
    fitted = {
        name: row["eval"]["value_fit"]
        for name, row in results["models"].items()
        if "value_fit" in row["eval"]
    }
    for name, fit in fitted.items():
        auc = "n/a" if fit.get("held_out_auc") is None else f"{fit['held_out_auc']:.3f}"
        lines += [
            "",
            f"{name}'s value head was fitted to its own samples after training (`latentloop fit-value`, "
            f"{fit['steps']} updates on {fit['rollouts']:,} rollouts, {fit['seconds']:.0f} s, not counted in "
            f"the training budget); ROC AUC for a valid last-step answer on {fit['held_out_rollouts']} fresh rollouts: "
            f"{auc}.",
        ]
    curves = {name: row["eval"] for name, row in results["models"].items()}
    steps = sorted({p["steps"] for report in curves.values() for p in report["curve_steps"]})
    shown_steps = [s for s in steps if s <= 4 or s in (8, 16, 32) or s == steps[-1]]
    lines += [
        "",
        "Accuracy (vote) against depth: supervision steps (MDLM: unmasking steps; AR decodes in one pass):",
        "",
        "| model | " + " | ".join(str(s) for s in shown_steps) + " |",
        "|---|" + "---|" * len(shown_steps),
    ]
    for name, report in curves.items():
        by_step = {p["steps"]: p["accuracy"] for p in report["curve_steps"]}
        lines.append(f"| {name} | " + " | ".join(_pct(by_step.get(s)) for s in shown_steps) + " |")
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
            parts = [_pct(p["vote"]), _pct(p["value"])] + ([_pct(p.get("coverage"))] if has_cov else [])
            cells.append(" / ".join(parts))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if any(row["eval"].get("examples") for row in results["models"].values()):
        lines += ["", "A few answers of each model, solved puzzles first, drawn in `boards.png`."]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def plot_results(results: dict[str, Any], path: Path) -> None:
    """Accuracy against steps, accuracy against samples and coverage against samples, every model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    if results.get("kind") == "generation":  # the models' sample grids side by side
        grids = [(name, row["eval"].get("image")) for name, row in models.items()]
        grids = [(name, image) for name, image in grids if image and Path(image).is_file()]
        if not grids:
            return
        fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 4.4), squeeze=False)
        for ax, (name, image) in zip(axes[0], grids, strict=True):
            ax.imshow(plt.imread(image))
            ax.set_title(name)
            ax.axis("off")
        fig.tight_layout()
        with atomic_path(path) as temp:
            fig.savefig(temp, format="png", dpi=110)
        plt.close(fig)
        return
    if results.get("kind") == "lm":
        fig, ax = plt.subplots(figsize=(4.8, 3.6))
        for row in summary_rows(results):
            depths = sorted(row["by_depth"])
            ax.plot(depths, [row["by_depth"][d] for d in depths], "o-", label=row["model"], markersize=3)
        ax.set(
            xscale="log", xlabel="test-time depth (core iterations)", ylabel=row["metric"].replace("_", " ")
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.suptitle(results["experiment"])
        fig.tight_layout()
        with atomic_path(path) as temp:
            fig.savefig(temp, format="png", dpi=110)
        plt.close(fig)
        return
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
        axes[1].plot(ks, [p["value"] for p in report["curve_samples"]], "o-", label=name, markersize=3)
        if has_cov and "coverage" in report:
            axes[2].plot(ks, [p["coverage"] for p in report["curve_samples"]], "o-", label=name, markersize=3)
    axes[0].set(xlabel="supervision steps", ylabel="accuracy (vote)", title="depth")
    axes[1].set(xlabel="samples", ylabel="accuracy (value head)", title="width")
    if has_cov:
        axes[2].set(xlabel="samples", ylabel="coverage", title="distinct solutions found")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(results["experiment"])
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, format="png", dpi=110)
    plt.close(fig)
