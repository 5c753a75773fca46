"""What the kinds' evaluations share: the files each step stores in a model's folder (read back on a rerun that
asks the same), paths written relative to the output folder, and the steps a puzzle reasoner is evaluated at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from latentloop.experiments.spec import EvalSpec
from latentloop.io import atomic_write_text
from latentloop.models.reasoners import REASONERS
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


def eval_steps(arch: str, settings: EvalSpec) -> int | None:
    """The supervision steps a reasoner ``arch`` is evaluated at: the experiment's ``eval.steps``, or
    ``None`` (its own default) for a generative baseline."""
    # The generative baselines decode with their own loop (AR: one pass; MDLM: its unmasking steps), so the
    # experiment's supervision-step count does not apply to them.
    return None if REASONERS[arch].generative else settings.steps
