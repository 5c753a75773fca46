"""Recursive puzzle reasoners under one interface (see :mod:`latentloop.models.reasoners.base`).

Every module of this package is imported here, and each :class:`Reasoner` subclass with an ``arch`` registers
itself in :data:`REASONERS`: a new model is one new file in this folder.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

from latentloop.config import from_dict
from latentloop.errors import UsageError
from latentloop.hub import resolve_model
from latentloop.models.reasoners.ar import ARReasoner
from latentloop.models.reasoners.base import (
    REASONERS,
    Reasoner,
    ReasonerConfig,
    ReasonerOutput,
    lecun_init,
    num_parameters,
)
from latentloop.models.reasoners.direct import DirectReasoner
from latentloop.models.reasoners.gram import GRAMReasoner
from latentloop.models.reasoners.heads import VALUE_HEAD_FILE
from latentloop.models.reasoners.hrm import HRMReasoner
from latentloop.models.reasoners.looped import LoopedReasoner
from latentloop.models.reasoners.mdlm import MDLMReasoner
from latentloop.models.reasoners.trm import TRMReasoner

for _module in pkgutil.iter_modules(__path__):  # the models added as files of their own
    importlib.import_module(f"{__name__}.{_module.name}")


def build_reasoner(arch: str, config: ReasonerConfig) -> Reasoner:
    """A fresh reasoner ``arch`` (a name of :data:`REASONERS`: direct, looped, hrm, trm, gram, ar, mdlm, ...)."""
    if arch not in REASONERS:
        raise UsageError(f"unknown model {arch!r} (known: {', '.join(sorted(REASONERS))})")
    model = REASONERS[arch](config)
    if config.init == "lecun":
        lecun_init(model)
    return model


def load_reasoner(
    checkpoint: str | Path,
    weights: str = "model.safetensors",
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    token: str | bool | None = None,
) -> Reasoner:
    """The reasoner saved in checkpoint folder ``checkpoint`` (its ``config.json`` and ``weights``), with the
    value head fitted to its samples when the folder holds one (``value_head.safetensors``). ``checkpoint`` may
    also be a Hub repository id ``org/name``, fetched at ``revision`` through the Hugging Face cache
    (``cache_dir``, ``token``: see :func:`latentloop.hub.resolve_model`; a local folder of the same name wins)."""
    checkpoint = resolve_model(checkpoint, revision=revision, cache_dir=cache_dir, token=token)
    try:
        data: dict[str, Any] = json.loads((checkpoint / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UsageError(f"{checkpoint}/config.json does not load: {error}") from None
    data.pop("model_type", None)
    model = build_reasoner(str(data.pop("arch", "")), from_dict(ReasonerConfig, data, prefix="model."))
    model.load_weights(checkpoint / weights)
    if weights == "model.safetensors" and (checkpoint / VALUE_HEAD_FILE).is_file():
        model.load_fitted_value_head(checkpoint / VALUE_HEAD_FILE)
    return model


__all__ = [
    "REASONERS",
    "ARReasoner",
    "DirectReasoner",
    "GRAMReasoner",
    "HRMReasoner",
    "LoopedReasoner",
    "MDLMReasoner",
    "Reasoner",
    "ReasonerConfig",
    "ReasonerOutput",
    "TRMReasoner",
    "build_reasoner",
    "load_reasoner",
    "num_parameters",
]
