"""The looped language models latentloop loads, by the ``model_type`` of their ``config.json``, and their
weight-quantized folders (``quantization.json`` beside the family's ``config.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from latentloop.errors import UsageError
from latentloop.hub import resolve_model
from latentloop.models.huginn_format import read_safetensors_folder
from latentloop.models.ouro import MODEL_TYPE as OURO_MODEL_TYPE
from latentloop.models.ouro import OuroLM, read_ouro_config
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM, load_config_json
from latentloop.nn.quantized import (
    WEIGHT_FORMATS,
    Int8Embedding,
    check_weight_format,
    is_quantized,
    quantize_weights,
)
from latentloop.nn.rope import RotaryEmbedding

# model_type -> class; a checkpoint without model_type is taken for a recurrent-depth (Huginn) one.
LOOPED_LMS: dict[str, type[RecurrentDepthLM] | type[OuroLM]] = {
    RecurrentDepthConfig.model_type: RecurrentDepthLM,
    OURO_MODEL_TYPE: OuroLM,
}
QUANTIZATION_FILE = "quantization.json"
"""Marks a folder written by :func:`save_quantized`: the weight format and the tensors stored once for two names."""


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
    weights: str | None = None,
) -> RecurrentDepthLM | OuroLM:
    """A Huginn-layout or Ouro-layout checkpoint from a local folder or a Hub id, as its own class; a folder of
    :func:`save_quantized` loads quantized. ``weights`` (``"int8"``) quantizes the linear and embedding
    weights as they load (:func:`~latentloop.nn.quantized.quantize_weights`)."""
    check_weight_format(weights)
    folder = resolve_model(path, revision=revision)
    if (folder / QUANTIZATION_FILE).is_file():
        return load_quantized(folder, dtype=dtype, device=device)
    model = looped_lm_class(folder).from_pretrained(folder, dtype=dtype, device=device)
    return model if weights is None else quantize_weights(model, weights).eval()


def save_quantized(model: RecurrentDepthLM | OuroLM, folder: Path) -> None:
    """Write ``model``, quantized by :func:`~latentloop.nn.quantized.quantize_weights`, into ``folder``: its
    family's ``config.json``, ``model.safetensors`` with latentloop's names (a tensor two layers share, as a
    tied output layer, stored once) and ``quantization.json``. :func:`load_looped_lm` reads it back."""
    if not is_quantized(model):
        raise UsageError("save_quantized takes a model whose weights quantize_weights quantized")
    config = model.config.to_ouro_dict() if isinstance(model, OuroLM) else model.config.to_huginn_dict()
    state: dict[str, torch.Tensor] = {}
    shared: dict[str, str] = {}
    first: dict[tuple[int, tuple[int, ...]], str] = {}
    for key, tensor in model.state_dict().items():
        where = (tensor.data_ptr(), tuple(tensor.shape))
        if where in first:
            shared[key] = first[where]
        else:
            first[where] = key
            state[key] = tensor.detach().contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    spec = {"weights": "int8", "scheme": "symmetric, one fp32 scale per output row", "shared": shared}
    (folder / QUANTIZATION_FILE).write_text(json.dumps(spec, indent=2))


def load_quantized(
    folder: Path, dtype: torch.dtype | None = torch.float32, device: str | torch.device = "cpu"
) -> RecurrentDepthLM | OuroLM:
    """The model a :func:`save_quantized` folder holds, its unquantized parameters and activations in ``dtype``
    (None: fp32), every key and shape checked."""
    spec = _read_quantization(folder)
    cls = looped_lm_class(folder)
    config = read_ouro_config(folder) if cls is OuroLM else load_config_json(folder)
    with torch.device("meta"):
        model = quantize_weights(cls(config), spec["weights"])
    dtype = dtype or torch.float32
    state = {}
    for key, tensor in read_safetensors_folder(folder).items():
        keep = tensor.dtype == torch.int8 or key.endswith(".scale")
        # A fresh copy: the file's tensors may start at any byte, and the int8 kernel reads aligned rows.
        state[key] = tensor.to(device, None if keep else dtype, copy=True)
    for key, source in spec["shared"].items():
        if source not in state:
            raise UsageError(
                f"{folder / QUANTIZATION_FILE}: {key!r} shares {source!r}, which the weights lack"
            )
        state[key] = state[source]
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        which, key = ("missing", missing[0]) if missing else ("unexpected", unexpected[0])
        raise UsageError(f"{folder}: the quantized weights have {which} key {key!r}")
    for key, tensor in expected.items():
        int8 = (state[key].dtype == torch.int8, tensor.dtype == torch.int8)
        if tuple(state[key].shape) != tuple(tensor.shape) or int8[0] != int8[1]:
            raise UsageError(
                f"{folder}: {key} has shape {tuple(state[key].shape)} {state[key].dtype}, the config "
                f"implies {tuple(tensor.shape)} {tensor.dtype}"
            )
    model.load_state_dict(state, assign=True)
    for module in model.modules():
        if isinstance(module, Int8Embedding):
            module.dtype = dtype
        if isinstance(module, RotaryEmbedding):  # non-persistent: built on the meta device, rebuilt for real
            module.rotations = module.cos_sin().to(device)
    return model.eval()


def _read_quantization(folder: Path) -> dict[str, Any]:
    file = folder / QUANTIZATION_FILE
    try:
        spec = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{file} is not valid JSON: {error}") from None
    if not isinstance(spec, dict) or spec.get("weights") not in WEIGHT_FORMATS:
        raise UsageError(f"{file}: weights must be one of {', '.join(WEIGHT_FORMATS)}")
    if not isinstance(spec.get("shared", {}), dict):
        raise UsageError(f"{file}: shared must map a key to the key it shares")
    spec.setdefault("shared", {})
    return spec
