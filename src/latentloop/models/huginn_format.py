"""Reading and writing the huginn-0125 checkpoint layout: ``config.json`` plus safetensors (one file or shards)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from latentloop.errors import UsageError
from latentloop.nn import RotaryEmbedding

if TYPE_CHECKING:
    from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

TOLERATED_EXTRA_KEYS = {"freqs_cis"}


def read_safetensors_folder(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [path / name for name in sorted(set(weight_map.values()))]
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
            raise UsageError(f"{index} is malformed: {error}") from None
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UsageError(f"{index} names shard {missing[0]}, which is missing")
    else:
        raise UsageError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError) as error:
            raise UsageError(f"{file} is not a readable safetensors file: {error}") from None
    return state


def load_huginn(
    cls: type[RecurrentDepthLM],
    config: RecurrentDepthConfig,
    path: Path,
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
) -> RecurrentDepthLM:
    """Build the model of ``config`` (read from ``path/config.json``) and load its weights from ``path``,
    checking every key and shape."""
    state = read_safetensors_folder(path)
    with torch.device("meta"):
        model = cls(config)
    expected = model.state_dict()
    if config.tie_embeddings:
        expected.pop("lm_head.weight")
        tied_head = state.pop("lm_head.weight", None)
    unexpected = sorted(set(state) - set(expected) - TOLERATED_EXTRA_KEYS)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UsageError(f"{path}: weights are missing {missing[0]!r} ({len(missing)} missing keys in all)")
    if unexpected:
        raise UsageError(f"{path}: unexpected weight {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise UsageError(
                f"{path}: config.json does not match the weights: {key} has shape {tuple(state[key].shape)}, "
                f"the config implies {tuple(tensor.shape)}"
            )
    if (
        config.tie_embeddings
        and tied_head is not None
        and not torch.equal(tied_head, state["transformer.wte.weight"])
    ):
        raise UsageError(
            f"{path}: config ties embeddings, but lm_head.weight differs from transformer.wte.weight"
        )
    target_dtype = dtype or state["transformer.wte.weight"].dtype
    tensors = {k: state[k].to(device=device, dtype=target_dtype) for k in expected}
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    # Non-persistent buffers (rotary tables) were built on the meta device: rebuild them for real.
    model.rope = RotaryEmbedding(config.head_dim, config.block_size, config.rope_base).to(device)
    return model.eval()


def save_huginn(model: RecurrentDepthLM, path: Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``path``; the folder is replaced only when complete."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} exists and is not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file(model.huginn_state_dict(), str(temp / "model.safetensors"), metadata={"format": "pt"})
        (temp / "config.json").write_text(json.dumps(model.config.to_huginn_dict(), indent=2))
        if path.exists():
            for item in temp.iterdir():
                item.replace(path / item.name)
            temp.rmdir()
        else:
            temp.rename(path)
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)
