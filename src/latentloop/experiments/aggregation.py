"""An experiment's results: every model's row, what was measured on, and what the experiment's kind adds."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import torch

from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.experiments.spec import Experiment
from latentloop.paths import shipped_or_relative
from latentloop.runtime import cpu_description


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpu": cpu_description(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def collect_results(
    experiment: Experiment,
    kind: ExperimentKind,
    rows: dict[str, Any],
    started: datetime.datetime,
    minutes: float | None,
    jobs: int,
    threads: int,
) -> dict[str, Any]:
    """The experiment's ``results.json``: its settings, the machine, every model's row (``rows``), and what
    ``kind`` makes of the rows together. ``minutes``: each model's time cap; ``jobs`` models trained at once
    on ``threads`` torch threads each."""
    own = {spec.name: spec.eval_overrides for spec in experiment.models}
    results = {
        "experiment": experiment.name,
        "kind": experiment.kind,
        "description": experiment.description,
        "file": shipped_or_relative(experiment.path),
        "date": started.strftime("%Y-%m-%d"),
        "machine": machine(),
        "budget_minutes_per_model": minutes,
        "jobs": jobs,
        "threads_per_model": threads,
        "schedule_fraction": experiment.schedule_fraction,
        "overrides": experiment.overrides,
        "eval": vars(experiment.eval),
        # A model evaluated with its own eval.* overrides names them in its row.
        "models": {
            name: {**row, "eval_overrides": own[name]} if own.get(name) else row for name, row in rows.items()
        },
        "paper": experiment.paper,
        "paper_note": experiment.paper_note,
    }
    return {**results, **kind.aggregate(experiment, rows)}
