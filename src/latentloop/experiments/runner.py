"""Running an experiment: train every model under its budget, evaluate (or sample) each alike, and write the
results and the report into the output folder.

Each step stores what it produced in the model's folder (``train.json``, ``eval.json``, ``sample.json``, and
for ``kind: time-to-accuracy`` ``curve.json``, one point per checkpoint), so a rerun resumes an interrupted run
and skips what has finished with the same settings.

The paths written into these files and ``results.json`` are relative, so the files read the same on any
machine: a run's own files (``run``, ``checkpoint``, ``written``, ``image``, a fitted value head's ``file``)
relative to the output folder (``gram/checkpoints/step_00000100``), a model's run config relative to the
experiment file (``../nqueens8-gram.yaml``, as the file names it), and the experiment file as
``configs/experiments/NAME.yaml`` when it ships with latentloop (else relative to the working directory).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import multiprocessing
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch

from latentloop.config import load_yaml
from latentloop.errors import UsageError
from latentloop.eval.generation import sample_run
from latentloop.eval.lm import evaluate_lm
from latentloop.eval.reasoners import evaluate_reasoner, load_run, run_dataset
from latentloop.experiments.report import TIME_TO_ACCURACY, plot_example_boards, plot_results, report_markdown
from latentloop.experiments.spec import EvalSpec, Experiment, ModelSpec, positive_number
from latentloop.io import atomic_write_text
from latentloop.models.reasoners import REASONERS
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.paths import relative_path, shipped_or_relative
from latentloop.train.checkpoint import list_checkpoints, read_trainer_state
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


# The keys of an evaluation's report that name files of the run (a fitted value head's under "value_fit").
_PATH_KEYS = ("run", "checkpoint", "image")


def _portable(report: dict[str, Any], base: Path) -> dict[str, Any]:
    """``report`` with the paths of the run's files relative to ``base``, the experiment's output folder."""
    report = dict(report)
    for key in _PATH_KEYS:
        if isinstance(report.get(key), str):
            report[key] = relative_path(report[key], base)
    if isinstance(report.get("written"), list):
        report["written"] = [relative_path(p, base) for p in report["written"]]
    fit = report.get("value_fit")
    if isinstance(fit, dict) and isinstance(fit.get("file"), str):
        report["value_fit"] = {**fit, "file": relative_path(fit["file"], base)}
    return report


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"cannot write to output folder {out}: {error.strerror or error}") from None


def _trained_specs(experiment: Experiment) -> list[ModelSpec]:
    """The models as they are trained. For ``kind: time-to-accuracy`` each gets a checkpoint every
    ``eval.every`` batches and keeps them all, and runs no evaluation of its own while it trains (that would
    count in its minutes); these come after its own overrides, so they win, and being part of the overrides
    they are recorded in ``train.json`` and checked alike on a rerun."""
    if experiment.kind != TIME_TO_ACCURACY:
        return list(experiment.models)
    every = experiment.eval.every
    extra = [f"train.checkpoint_every={every}", "train.keep_checkpoints=0", "train.eval_every=0"]
    return [dataclasses.replace(spec, overrides=[*spec.overrides, *extra]) for spec in experiment.models]


def _run_config(spec: ModelSpec, lm: bool, extra: list[str] | None = None) -> Any:
    """A model's run config (a recurrent-depth LM's with ``lm``, else a reasoner's) with its overrides, then
    ``extra`` ones."""
    build = build_run_config if lm else build_reasoner_config
    return build(load_yaml(spec.config), [*spec.overrides, *(extra or [])])


def planned_steps(experiment: Experiment) -> dict[str, int]:
    """The schedule each model of ``experiment`` trains, in steps (batches), as its run config and overrides
    fix it: what the experiment's numbers come from on any machine, unless a time cap stops a model sooner."""
    lm = experiment.kind == "lm"
    return {spec.name: _run_config(spec, lm).train.steps for spec in _trained_specs(experiment)}


def scale_schedules(experiment: Experiment, fraction: float) -> Experiment:
    """``experiment`` with every model's schedule shortened to ``fraction`` (in (0, 1]) of its steps, rounded
    (``train.steps`` added to its overrides, so its run and its ``train.json`` record it), and its training
    minutes on the reference machine with it: the same recipes on a shorter fixed schedule, to measure the
    margin by which a result holds."""
    if not 0 < fraction <= 1:
        raise UsageError(f"the schedule fraction (--schedule) must be in (0, 1], got {fraction:g}")
    if fraction == 1:
        return experiment
    steps = planned_steps(experiment)
    models = [
        dataclasses.replace(
            spec,
            overrides=[*spec.overrides, f"train.steps={max(1, round(fraction * steps[spec.name]))}"],
            reference_minutes=None if spec.reference_minutes is None else fraction * spec.reference_minutes,
        )
        for spec in experiment.models
    ]
    # The reference machine's training minutes shrink with the schedule; the whole run's (evaluation
    # included) are not known.
    return dataclasses.replace(experiment, models=models, schedule_fraction=fraction, expected_minutes=None)


def _budget_overrides(minutes: float | None) -> list[str]:
    """The override that caps a model's training at ``minutes`` of wall-clock (none without a cap)."""
    return [] if minutes is None else [f"train.budget_minutes={minutes}"]


def _check_run_configs(experiment: Experiment, minutes: float | None) -> None:
    """Build every model's run config with its overrides and the time cap it trains under (as
    :func:`_train_model` does), so that a bad key or value stops the experiment before any model trains."""
    for spec in _trained_specs(experiment):
        _run_config(spec, experiment.kind == "lm", _budget_overrides(minutes))


def pace_line(
    name: str, seconds: float, reference_minutes: float | None, experiment_minutes: float | None
) -> str:
    """What ``latentloop run`` says once a model's first batches are timed: its training's expected minutes
    on this machine (``seconds``), and where the reference machine's are known, this machine's speed against
    it and the whole experiment's expected minutes here."""
    line = f"{name}: training takes about {seconds / 60:.0f} min on this machine"
    if reference_minutes is None:
        return line
    speed = reference_minutes * 60 / max(seconds, 1e-9)
    line += f", {reference_minutes:g} on the reference machine ({speed:.2f}x its speed)"
    if experiment_minutes is not None:
        line += f"; the whole experiment about {experiment_minutes / speed:.0f} min here ({experiment_minutes:g} there)"
    return line


def _train_model(
    spec: ModelSpec,
    folder: Path,
    minutes: float | None,
    progress: bool,
    log: Callable[[str], None],
    lm: bool = False,
    config_name: str | None = None,
    experiment_minutes: float | None = None,
) -> dict[str, Any]:
    """Train (or resume) one model (a reasoner, or with ``lm`` a recurrent-depth LM) through its whole schedule,
    or until ``minutes`` of wall-clock when a time cap is given; its summary is stored in ``train.json`` once
    training has finished, and a rerun with the same cap returns it untrained. The summary says which schedule
    ran: ``planned_steps`` (the config's ``train.steps``) and ``step`` (those trained; fewer only when the cap
    stopped it, ``time_capped``). ``config_name``: the run config as the summary names it (default: its
    path). Once its first batches are timed, :func:`pace_line` is logged (``experiment_minutes``: the whole
    experiment's on the reference machine)."""
    config_name = config_name or str(spec.config)
    done = _read_json(folder / "train.json")
    if done is not None and done.get("overrides", []) != spec.overrides:
        raise UsageError(
            f"{folder} was trained with overrides {done.get('overrides', [])}, not {spec.overrides}; "
            "use another --out"
        )
    if done is not None and done.get("budget_minutes") == minutes:
        log(f"{spec.name}: trained already ({done['step']} steps), skipping")
        return {**done, "config": config_name}
    config = _run_config(spec, lm, _budget_overrides(minutes))
    planned = config.train.steps
    cap = "" if minutes is None else f", capped at {minutes:g} min"
    log(f"{spec.name}: training {planned} steps{cap} in {folder}")

    def on_pace(seconds: float) -> None:
        log(pace_line(spec.name, seconds, spec.reference_minutes, experiment_minutes))

    if lm:
        result = train(config, folder, progress=progress, on_pace=on_pace)
        with torch.device("meta"):  # the count only: no weights drawn
            parameters = RecurrentDepthLM(config.model).num_parameters()
        arch, seen = config.arch, {"tokens_seen": result.counts["tokens_seen"]}
    else:
        result = train(config, folder, progress=spec.name if progress else False, log=None, on_pace=on_pace)
        parameters, arch = result.counts["parameters"], config.arch
        seen = {"examples_seen": result.counts["examples_seen"], "flops": result.counts["flops"]}
    summary = {
        "model": spec.name,
        "arch": arch,
        "config": config_name,
        "overrides": spec.overrides,
        "budget_minutes": minutes,
        "parameters": parameters,
        "planned_steps": planned,
        "step": result.step,
        "stopped": result.stopped,
        # Stopped by the cap, or its schedule fitted to the cap (train.fit_steps): fewer steps than planned
        "time_capped": minutes is not None and result.step < planned,
        **seen,
        "train_minutes": round(result.elapsed_s / 60, 2),
        "torch_threads": torch.get_num_threads(),
        "precision": result.precision,
        "final_loss": result.losses[-1] if result.losses else None,
    }
    _write_json(folder / "train.json", summary)
    return summary


def _evaluate_lm(spec: ModelSpec, folder: Path, settings: EvalSpec, log: Callable[[str], None]) -> dict:
    """The held-out metric at each depth of ``settings.depths``, on the run's held-out split or on each of
    ``settings.tiers``, and the depth x width grid of ``settings.width`` (stored as the run's ``eval.json``;
    a rerun with the same settings reads it back)."""
    wanted = {
        "depths": settings.depths,
        "limit": settings.limit,
        "tiers": settings.tiers,
        "width": settings.width,
    }
    report = _read_json(folder / "eval.json")
    if report is not None and report.get("settings") == wanted:
        log(f"{spec.name}: evaluated already, skipping")
        return report  # written by _portable: its paths are relative to the output folder already
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
    report = _portable(report, folder.parent)
    _write_json(folder / "eval.json", report)
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
        return report  # written by _portable: its paths are relative to the output folder already
    log(f"{spec.name}: drawing {settings.samples} unconditional samples")
    # images: MODEL/samples.png
    report = sample_run(folder, settings.samples, None, 0, settings.temperature, 256, None, None)
    report = _portable(report, folder.parent)
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
    steps = _eval_steps(arch, settings)
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
        and report.get("split", "test") == settings.split
    ):
        log(f"{spec.name}: evaluated already, skipping")
        return report  # written by _portable: its paths are relative to the output folder already
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
    )
    report["limit"], report["requested_steps"] = settings.limit, steps
    if value_fit is not None:
        report["value_fit"] = value_fit
    report = _portable(report, folder.parent)
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


def _eval_steps(arch: str, settings: EvalSpec) -> int | None:
    # The generative baselines decode with their own loop (AR: one pass; MDLM: its unmasking steps), so the
    # experiment's supervision-step count does not apply to them: they use their own default.
    return None if REASONERS[arch].generative else settings.steps


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
        steps=_eval_steps(arch, settings),
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


def _evaluate_curve(
    spec: ModelSpec, folder: Path, arch: str, settings: EvalSpec, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every checkpoint of the run folder evaluated (:func:`evaluate_checkpoint`), ordered by step.

    The points are cached in ``MODEL/curve.json`` keyed by checkpoint step, written after each one: a rerun
    evaluates only the checkpoints it has not seen (all of them again when the evaluation settings changed).
    """
    wanted = {
        "samples": settings.samples,
        "steps": _eval_steps(arch, settings),
        "limit": settings.limit,
        "seed": settings.seed,
        "temperature": settings.temperature,
    }
    if settings.split != "test":  # caches written before eval.split existed stay valid
        wanted["split"] = settings.split
    cache = _read_json(folder / "curve.json")
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
        _write_json(folder / "curve.json", {"settings": wanted, "points": points})
    return sorted(points.values(), key=lambda p: p["step"])


def first_reached(curve: list[dict[str, Any]], metric: str, target: float) -> dict[str, Any] | None:
    """The first point of ``curve`` (ordered by step) whose ``metric`` (a fraction) reaches ``target`` (a
    percent), or ``None`` when none does."""
    for point in curve:
        value = point.get(metric)
        if value is not None and 100 * value >= target - 1e-9:  # 0.57 * 100 is 56.99999999999999
            return point
    return None


COST_KEYS = ("step", "train_minutes", "examples_seen", "flops")
FINAL_KEYS = (*COST_KEYS, "accuracy", "accuracy_1_sample", "accuracy_value", "coverage")


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


def _relative_config(config: Path, experiment: Experiment) -> str:
    """A model's run config as written relative to the experiment file (its name when that fails)."""
    try:
        return os.path.relpath(config, experiment.path.resolve().parent)
    except ValueError:  # another drive (Windows)
        return config.name


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
        added.insert(0, f"config {_relative_config(spec.config, experiment)}")
    return added


def _config_value(config: dict[str, Any], dotted: str) -> str | None:
    """The value a run config gives the dotted key, as JSON text (None where the config lacks it)."""
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, str) else json.dumps(value)


def _time_to_accuracy_row(
    experiment: Experiment,
    index: int,
    folder: Path,
    train_summary: dict[str, Any],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """A model's row of a time-to-accuracy experiment: its curve over all checkpoints and its summary."""
    spec = experiment.models[index]
    curve = _evaluate_curve(spec, folder, train_summary["arch"], experiment.eval, log)
    return {
        "train": train_summary,
        "config": _relative_config(spec.config, experiment),
        "adds": _adds(spec, experiment.models[index - 1] if index else None, experiment),
        "curve": curve,
        "summary": curve_summary(curve, experiment.targets),
    }


# The CPU's vector extensions that decide the speed of fp32 and bf16 matmuls on the CPU.
_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _cpu() -> str | None:
    """The processor's name and its vector extensions among ``_VECTOR_FLAGS``, as Linux reports them (None
    elsewhere): ``AMD EPYC (avx2 avx512f avx512_bf16)``."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    if name is None:
        return None
    vector = " ".join(f for f in _VECTOR_FLAGS if f in flags)
    return f"{name} ({vector})" if vector else name


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpu": _cpu(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def _model_row(
    experiment: Experiment,
    index: int,
    spec: ModelSpec,
    out: Path,
    minutes: float | None,
    progress: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train model ``index`` of ``experiment`` (``spec``) into ``out / spec.name`` and evaluate it: its row of
    the results."""
    folder = out / spec.name
    train = _train_model(
        spec,
        folder,
        minutes,
        progress,
        log,
        lm=experiment.kind == "lm",
        config_name=_relative_config(spec.config, experiment),
        experiment_minutes=experiment.expected_minutes,
    )
    if experiment.kind == TIME_TO_ACCURACY:
        return _time_to_accuracy_row(experiment, index, folder, train, log)
    if experiment.kind == "lm":
        report = _evaluate_lm(spec, folder, experiment.eval, log)
    elif experiment.kind == "generation":
        report = _sample_model(spec, folder, experiment.eval, log)
    else:
        report = _evaluate_model(spec, folder, train["arch"], experiment.eval, log, progress)
    return {"train": train, "eval": report}


def _log_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stop_when_orphaned(parent: int, poll_s: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM once its parent is no longer ``parent`` (it died and the process was
    adopted), checked every ``poll_s`` seconds: a worker whose ``latentloop run`` was killed then checkpoints
    and stops, rather than train on with no one to report to, or beside a restarted run in the same folder."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-when-orphaned", daemon=True)
    thread.start()
    return thread


def _model_row_in_worker(threads: int, parent: int, *args: Any) -> dict[str, Any]:
    """:func:`_model_row` in a worker process of its own, on ``threads`` of the machine's cores; it logs to
    standard error and shows no progress bar (several would overwrite each other). Interrupted (Ctrl-C, or
    SIGTERM from its parent's death or the pool's shutdown), it exits once training has checkpointed instead
    of taking the next model from the pool's queue."""
    torch.set_num_threads(threads)
    stop_when_orphaned(parent)
    try:
        return _model_row(*args, False, _log_to_stderr)
    except KeyboardInterrupt:
        os._exit(130)


def threads_per_job(jobs: int) -> int:
    """The torch threads each of ``jobs`` models trained at once gets: an equal share of this process's."""
    return max(1, torch.get_num_threads() // jobs)


def _model_rows_side_by_side(
    experiment: Experiment, specs: list[ModelSpec], out: Path, minutes: float | None, jobs: int
) -> dict[str, Any]:
    """The rows of :func:`_model_row` with ``jobs`` models trained and evaluated at once, each in its own
    process on :func:`threads_per_job` of the cores (see ``jobs`` in :mod:`latentloop.experiments`)."""
    threads = threads_per_job(jobs)
    context = multiprocessing.get_context("spawn")  # forking a process that has run torch is unsafe
    parent = os.getpid()
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {
                spec.name: pool.submit(
                    _model_row_in_worker, threads, parent, experiment, index, spec, out, minutes
                )
                for index, spec in enumerate(specs)
            }
            return {name: future.result() for name, future in futures.items()}
    except BrokenProcessPool:  # the pool has stopped the other workers, which checkpoint as they go
        _log_to_stderr("a worker process stopped (interrupted, killed or out of memory); run again to resume")
        raise KeyboardInterrupt from None


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
    is reported as time-capped, N of its M planned steps. For ``kind: time-to-accuracy`` every model
    keeps a checkpoint every ``eval.every`` batches, each of which is evaluated (resumably, see
    :func:`_evaluate_curve`), and the results hold each model's curve, the first point reaching each target,
    and the gain of each row over the row before it (:func:`ablation_gains`).
    """
    out = Path(out)
    if budget_minutes is not None:
        per_model = positive_number(budget_minutes, "--budget-minutes") / len(experiment.models)
    else:
        per_model = experiment.budget_minutes
    minutes = None if per_model is None else round(per_model, 4)
    _check_run_configs(experiment, minutes)
    _check_writable(out)
    jobs = min(experiment.jobs, len(experiment.models))
    started = datetime.datetime.now(datetime.timezone.utc)
    specs = _trained_specs(experiment)
    if jobs == 1:
        rows = {
            spec.name: _model_row(experiment, index, spec, out, minutes, progress, log)
            for index, spec in enumerate(specs)
        }
    else:
        rows = _model_rows_side_by_side(experiment, specs, out, minutes, jobs)
    results = {
        "experiment": experiment.name,
        "kind": experiment.kind,
        "description": experiment.description,
        "file": shipped_or_relative(experiment.path),
        "date": started.strftime("%Y-%m-%d"),
        "machine": machine(),
        "budget_minutes_per_model": minutes,
        "jobs": jobs,
        "threads_per_model": threads_per_job(jobs),
        "schedule_fraction": experiment.schedule_fraction,
        "overrides": experiment.overrides,
        "eval": vars(experiment.eval),
        "models": rows,
        "paper": experiment.paper,
        "paper_note": experiment.paper_note,
    }
    if experiment.kind == TIME_TO_ACCURACY:
        results["targets"] = experiment.targets
        results["ablation"] = ablation_gains(rows, experiment.targets)
    _write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report_markdown(results))
    plot_results(results, out / "curves.png")
    if experiment.kind == "reasoners":
        plot_example_boards(results, out)
    return results
