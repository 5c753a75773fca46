"""Training an experiment's models: their run configs, their fixed schedules, and one model trained (or resumed)
into its folder with its summary in ``train.json``."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from latentloop.config import load_yaml
from latentloop.errors import UsageError
from latentloop.experiments.kinds import get_kind
from latentloop.experiments.spec import Experiment, ModelSpec
from latentloop.experiments.store import read_json, write_json
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.runtime import cpu_description
from latentloop.train.loop import TrainResult, train
from latentloop.train.run_config import build_reasoner_config, build_run_config


class ModelRuns(ABC):
    """How one family of models (puzzle reasoners, language models) is configured and trained."""

    @abstractmethod
    def config(self, spec: ModelSpec, extra: Sequence[str] = ()) -> Any:
        """The model's run config with its overrides, then ``extra`` ones."""

    @abstractmethod
    def train(
        self, config: Any, folder: Path, name: str, progress: bool, on_pace: Callable[[float], None]
    ) -> tuple[TrainResult, int, dict[str, Any]]:
        """Train (or resume) the run in ``folder``: its result, its parameter count, and what it has seen
        (the summary's counts). ``on_pace`` gets the expected seconds of the whole schedule once timed."""


class ReasonerRuns(ModelRuns):
    """How a puzzle reasoner's run is configured and trained."""

    def config(self, spec: ModelSpec, extra: Sequence[str] = ()) -> Any:
        """The model's run config with its overrides, then ``extra`` ones."""
        return build_reasoner_config(load_yaml(spec.config), [*spec.overrides, *extra])

    def train(
        self, config: Any, folder: Path, name: str, progress: bool, on_pace: Callable[[float], None]
    ) -> tuple[TrainResult, int, dict[str, Any]]:
        """Train the run; its result, its parameter count and what it has seen (examples, FLOPs)."""
        result = train(config, folder, progress=name if progress else False, log=None, on_pace=on_pace)
        seen = {"examples_seen": result.counts["examples_seen"], "flops": result.counts["flops"]}
        return result, result.counts["parameters"], seen


class LanguageModelRuns(ModelRuns):
    """How a recurrent-depth language model's run is configured and trained."""

    def config(self, spec: ModelSpec, extra: Sequence[str] = ()) -> Any:
        """The model's run config with its overrides, then ``extra`` ones."""
        return build_run_config(load_yaml(spec.config), [*spec.overrides, *extra])

    def train(
        self, config: Any, folder: Path, name: str, progress: bool, on_pace: Callable[[float], None]
    ) -> tuple[TrainResult, int, dict[str, Any]]:
        """Train the run; its result, its parameter count and the tokens it has seen."""
        result = train(config, folder, progress=progress, on_pace=on_pace)
        with torch.device("meta"):  # the count only: no weights drawn
            parameters = RecurrentDepthLM(config.model).num_parameters()
        return result, parameters, {"tokens_seen": result.counts["tokens_seen"]}


REASONER_RUNS = ReasonerRuns()
LM_RUNS = LanguageModelRuns()


def planned_steps(experiment: Experiment) -> dict[str, int]:
    """The schedule each model of ``experiment`` trains, in steps (batches), as its run config and overrides
    fix it: what the experiment's numbers come from on any machine, unless a time cap stops a model sooner."""
    kind = get_kind(experiment.kind)
    return {spec.name: kind.runs.config(spec).train.steps for spec in kind.trained_specs(experiment)}


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


def budget_overrides(minutes: float | None) -> list[str]:
    """The override that caps a model's training at ``minutes`` of wall-clock (none without a cap)."""
    return [] if minutes is None else [f"train.budget_minutes={minutes}"]


def check_run_configs(experiment: Experiment, minutes: float | None) -> None:
    """Build every model's run config with its overrides and the time cap it trains under (as
    :func:`train_model` does), so that a bad key or value stops the experiment before any model trains."""
    kind = get_kind(experiment.kind)
    for spec in kind.trained_specs(experiment):
        kind.runs.config(spec, budget_overrides(minutes))


def relative_config(config: Path, experiment: Experiment) -> str:
    """A model's run config as written relative to the experiment file (its name when that fails)."""
    try:
        return os.path.relpath(config, experiment.path.resolve().parent)
    except ValueError:  # another drive (Windows)
        return config.name


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


def last_logged_loss(folder: Path) -> float | None:
    """The last training loss ``folder/metrics.jsonl`` logged (the mean of its log window): the final loss of
    a run resumed from its last checkpoint, which trains no step itself."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "train" and isinstance(record.get("loss"), (int, float)):
            last = float(record["loss"])
    return last


def train_model(
    spec: ModelSpec,
    folder: Path,
    minutes: float | None,
    progress: bool,
    log: Callable[[str], None],
    runs: ModelRuns = REASONER_RUNS,
    config_name: str | None = None,
    experiment_minutes: float | None = None,
) -> dict[str, Any]:
    """Train (or resume) one model (configured and trained as ``runs`` says) through its whole schedule, or
    until ``minutes`` of wall-clock when a time cap is given; its summary is stored in ``train.json`` once
    training has finished, and a rerun with the same cap returns it untrained. The summary says which schedule
    ran: ``planned_steps`` (the config's ``train.steps``) and ``step`` (those trained; fewer only when the cap
    stopped it, ``time_capped``). ``config_name``: the run config as the summary names it (default: its
    path). Once its first batches are timed, :func:`pace_line` is logged (``experiment_minutes``: the whole
    experiment's on the reference machine)."""
    config_name = config_name or str(spec.config)
    done = read_json(folder / "train.json")
    if done is not None and done.get("overrides", []) != spec.overrides:
        raise UsageError(
            f"{folder} was trained with overrides {done.get('overrides', [])}, not {spec.overrides}; "
            "use another --out"
        )
    if done is not None and done.get("budget_minutes") == minutes:
        log(f"{spec.name}: trained already ({done['step']} steps), skipping")
        return {**done, "config": config_name}
    config = runs.config(spec, budget_overrides(minutes))
    planned = config.train.steps
    cap = "" if minutes is None else f", capped at {minutes:g} min"
    log(f"{spec.name}: training {planned} steps{cap} in {folder}")

    def on_pace(seconds: float) -> None:
        log(pace_line(spec.name, seconds, spec.reference_minutes, experiment_minutes))

    result, parameters, seen = runs.train(config, folder, spec.name, progress, on_pace)
    summary = {
        "model": spec.name,
        "arch": config.arch,
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
        "final_loss": result.losses[-1] if result.losses else last_logged_loss(folder),
        # Where and when it trained: a report assembled from runs made on several machines names each
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "cpu": cpu_description(),
    }
    write_json(folder / "train.json", summary)
    return summary
