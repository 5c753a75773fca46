"""Experiment kinds: what an experiment file's ``kind:`` names, each an :class:`~.base.ExperimentKind`.

A kind decides how an experiment's models are trained, evaluated and reported: which runs it builds, what it
measures on each, what it adds to the results, and its rows, Markdown and pictures. The runner and the report
ask the experiment's kind and do the rest alike. A new kind is one module with an ``ExperimentKind`` subclass
and a line in :data:`KINDS` (or a call of :func:`register_kind`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from latentloop.errors import UsageError

if TYPE_CHECKING:
    from latentloop.experiments.kinds.base import ExperimentKind

# The kind of an experiment file (and of results) that names none.
DEFAULT_KIND = "reasoners"

# name -> "module:Class"; a kind's module loads the training stack, so it is imported on first use and reading
# an experiment file stays fast.
KINDS: dict[str, str] = {
    "reasoners": "latentloop.experiments.kinds.reasoners:ReasonersKind",
    "lm": "latentloop.experiments.kinds.lm:LanguageModelKind",
    "generation": "latentloop.experiments.kinds.generation:GenerationKind",
    "time-to-accuracy": "latentloop.experiments.kinds.time_to_accuracy:TimeToAccuracyKind",
}


def register_kind(name: str, target: str) -> None:
    """Make ``target`` (``"package.module:Class"``, an ``ExperimentKind`` subclass) the experiments' ``kind:
    name``; the module is imported on first use."""
    if ":" not in target:
        raise ValueError(f"a kind is registered as 'module:Class', got {target!r}")
    KINDS[name] = target


def get_kind(name: str) -> ExperimentKind:
    """The kind registered as ``name``."""
    if name not in KINDS:
        raise UsageError(f"unknown experiment kind {name!r} (known: {', '.join(KINDS)})")
    module, _, cls = KINDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
