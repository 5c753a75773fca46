"""What each step of an experiment stores in a model's folder (``train.json``, ``eval.json``, ...): JSON written
atomically, read back by a rerun that asks the same, with the run's paths relative to the output folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from latentloop.io import atomic_write_text
from latentloop.paths import relative_path


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON in ``path``, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON stored in ``path``, or ``None`` where it is missing or unreadable (a step to do again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# The keys of an evaluation's report that name files of the run (a fitted value head's under "value_fit").
_PATH_KEYS = ("run", "checkpoint", "image")


def portable(report: dict[str, Any], base: Path) -> dict[str, Any]:
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
