"""The looped language models latentloop loads, by the ``model_type`` of their ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from latentloop.errors import UsageError
from latentloop.hub import resolve_model
from latentloop.models.ouro import MODEL_TYPE as OURO_MODEL_TYPE
from latentloop.models.ouro import OuroLM
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

# model_type -> class; a checkpoint without model_type is taken for a recurrent-depth (Huginn) one.
LOOPED_LMS: dict[str, type[RecurrentDepthLM] | type[OuroLM]] = {
    RecurrentDepthConfig.model_type: RecurrentDepthLM,
    OURO_MODEL_TYPE: OuroLM,
}


def looped_lm_class(folder: Path) -> type[RecurrentDepthLM] | type[OuroLM]:
    """The class of the checkpoint in ``folder``, read from its ``config.json``'s ``model_type``."""
    file = folder / "config.json"
    if not folder.is_dir():
        raise UsageError(f"checkpoint folder {folder} does not exist")
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise UsageError(f"{folder} has no config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{file} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{file} must hold a JSON object")
    kind = data.get("model_type", RecurrentDepthConfig.model_type)
    if kind not in LOOPED_LMS:
        raise UsageError(f"{file}: unknown model_type {kind!r} (known: {', '.join(LOOPED_LMS)})")
    return LOOPED_LMS[kind]


def load_looped_lm(
    path: str | Path,
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
    revision: str | None = None,
) -> RecurrentDepthLM | OuroLM:
    """A Huginn-layout or Ouro-layout checkpoint from a local folder or a Hub id, as its own class."""
    folder = resolve_model(path, revision=revision)
    return looped_lm_class(folder).from_pretrained(folder, dtype=dtype, device=device)
