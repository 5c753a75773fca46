"""The model families, by ``--model``/``arch`` name: how each builds its run config, and which checkpoints
it evaluates. ``train``, ``eval``, ``run``, ``sample`` and ``solve`` all look models up here.

There are two families: the recurrent-depth LM, and the puzzle reasoners, whose names are those of
:data:`latentloop.models.reasoners.REASONERS` (a reasoner registers itself by subclassing
:class:`~latentloop.models.reasoners.Reasoner` with an ``arch``). Both train with :func:`latentloop.train.train`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from latentloop.errors import UsageError
from latentloop.models.looped_lms import LOOPED_LMS
from latentloop.models.reasoners import REASONERS
from latentloop.train.checkpoint import resolve_checkpoint
from latentloop.train.run_config import (
    LM_ARCH,
    ReasonerRunConfig,
    RunConfig,
    build_reasoner_config,
    build_run_config,
)


@dataclass(frozen=True)
class Family:
    """One kind of model: how its run config is built (``build_config(data, overrides, task=, arch=)``, see
    :func:`latentloop.train.run_config.build_run_config`), and a test of its checkpoints' ``model_type``."""

    name: str
    build_config: Callable[..., RunConfig | ReasonerRunConfig]
    owns_model_type: Callable[[str], bool]


LANGUAGE_MODEL = Family(LM_ARCH, build_run_config, lambda kind: kind in LOOPED_LMS)
REASONER = Family(
    "reasoner", build_reasoner_config, lambda kind: kind in {f"reasoner-{arch}" for arch in REASONERS}
)
FAMILIES = (LANGUAGE_MODEL, REASONER)


def model_names() -> list[str]:
    """Every name ``--model`` accepts."""
    return sorted([LM_ARCH, *REASONERS])


def family(arch: str) -> Family:
    """The family of model ``arch`` (``recurrent-depth`` or a reasoner's name)."""
    if arch == LM_ARCH:
        return LANGUAGE_MODEL
    if arch in REASONERS:
        return REASONER
    raise UsageError(f"unknown model {arch!r} (known: {', '.join(model_names())})")


def checkpoint_model_type(run: str | Path) -> str:
    """The ``model_type`` of a run's newest checkpoint (or of a checkpoint folder)."""
    checkpoint = resolve_checkpoint(run)
    try:
        return str(json.loads((checkpoint / "config.json").read_text()).get("model_type", ""))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise UsageError(f"{checkpoint}/config.json is not a readable JSON object") from None


def family_of_run(run: str | Path) -> Family:
    """The family whose checkpoints ``run`` holds; a clear error for anything else."""
    kind = checkpoint_model_type(run)
    found = next((f for f in FAMILIES if f.owns_model_type(kind)), None)
    if found is None:
        raise UsageError(f"{run}: no evaluator for checkpoints of model_type {kind!r}")
    return found
