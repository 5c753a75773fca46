"""Small pretrained models shipped inside the package, so ``latentloop solve TASK PUZZLE`` answers right after
installation, without training.

Each folder under ``resources/pretrained/`` is a checkpoint (``config.json`` and the EMA weights
``model.safetensors``) plus ``run.yaml``, the configuration of the training run that produced it (a shipped
experiment's run), and optionally ``solve.yaml``, the test-time setting ``solve`` uses by default (chosen on the
validation split). ``scripts/pretrained.sh`` retrains them by replaying the same batches from the same seed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from latentloop.config import load_yaml
from latentloop.errors import UsageError
from latentloop.paths import PRETRAINED_DIR
from latentloop.tasks.base import format_task_spec


def pretrained_models(folder: Path = PRETRAINED_DIR) -> dict[str, Path]:
    """Task name -> the first shipped model's folder of that task (in name order)."""
    found: dict[str, Path] = {}
    for task, paths in pretrained_variants(folder).items():
        found[task] = paths[0]
    return found


def _natural_order(path: Path) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", path.name)]


def pretrained_variants(folder: Path = PRETRAINED_DIR) -> dict[str, list[Path]]:
    """Task name -> every shipped model's folder of that task, in name order with numbers read as numbers
    (``nqueens8-gram`` before ``nqueens10-gram``): a task may ship one model per puzzle size (6x6 and 9x9
    Sudoku; 8x8 and 10x10 N-Queens), and the first is its default."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.iterdir(), key=_natural_order) if folder.is_dir() else []:
        if (path / "run.yaml").is_file() and (path / "model.safetensors").is_file():
            found.setdefault(str(load_yaml(path / "run.yaml")["task"]["name"]), []).append(path)
    return found


def pretrained_task_spec(folder: Path) -> str:
    """The task (with the options it was trained on) of a shipped model, as ``name:key=value,...``."""
    task = dict(load_yaml(folder / "run.yaml")["task"])
    return format_task_spec(str(task.pop("name")), task)


# What a shipped model's solve.yaml may set, and the type of each
SOLVE_SETTINGS: dict[str, type] = {"steps": int, "samples": int, "select": str, "state_noise": float}


def pretrained_solve_settings(folder: Path) -> dict[str, Any]:
    """The test-time setting ``latentloop solve`` uses with a shipped model unless its options say otherwise:
    ``solve.yaml`` beside the weights (``steps``, ``samples``, ``select``, ``state_noise``); empty when the
    model ships without one (then one sample at its trained depth)."""
    path = folder / "solve.yaml"
    if not path.is_file():
        return {}
    settings = load_yaml(path) or {}
    unknown = sorted(set(settings) - set(SOLVE_SETTINGS))
    if unknown:
        raise UsageError(f"{path}: unknown solve settings {unknown} (known: {', '.join(SOLVE_SETTINGS)})")
    for key, kind in SOLVE_SETTINGS.items():
        value = settings.get(key)
        if value is not None and not (isinstance(value, kind) or (kind is float and type(value) is int)):
            what = {int: "a whole number", float: "a number", str: "a name"}[kind]
            raise UsageError(f"{path}: {key} must be {what}, got {value!r}")
    return settings


# solve's test-time setting where neither its options nor a shipped solve.yaml say otherwise
SOLVE_DEFAULTS: dict[str, Any] = {"steps": None, "samples": 1, "select": "vote", "state_noise": 0.0}


def solve_setting(folder: Path | None, **given: Any) -> dict[str, Any]:
    """``latentloop solve``'s test-time setting (``steps``, ``samples``, ``select``, ``state_noise``): each
    option ``given`` that is not None, else the shipped model's in ``folder`` (its ``solve.yaml``; ``None``:
    not a shipped model), else :data:`SOLVE_DEFAULTS`."""
    shipped = pretrained_solve_settings(folder) if folder is not None else {}
    setting = {
        key: given[key] if given.get(key) is not None else shipped.get(key, default)
        for key, default in SOLVE_DEFAULTS.items()
    }
    setting["state_noise"] = float(setting["state_noise"])
    return setting


def pretrained_model(
    task: str, fits: Callable[[Path], bool] | None = None, folder: Path = PRETRAINED_DIR
) -> Path:
    """The shipped model for ``task``: the first for which ``fits(folder)`` holds (e.g. its task parses the
    puzzle), else the first; a one-line error naming the alternatives when none ships."""
    variants = pretrained_variants(folder)
    if task not in variants:
        shipped = ", ".join(sorted(variants)) or "none"
        raise UsageError(
            f"no pretrained model ships for {task!r} (shipped: {shipped}); solve it with --exact or --model RUN"
        )
    return next((path for path in variants[task] if fits is not None and fits(path)), variants[task][0])
