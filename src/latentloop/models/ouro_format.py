"""Reading and writing Ouro's official checkpoint layout: ``config.json`` plus safetensors (one file or shards).

The official layer keeps separate ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` matrices and
names its four norms ``input_layernorm``, ``input_layernorm_2``, ``post_attention_layernorm`` and
``post_attention_layernorm_2``; latentloop's blocks fuse the projections (``attn.Wqkv``, ``mlp.fc``) and number
the norms. The two maps below convert between them, exactly (concatenation and split).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from latentloop.errors import UsageError
from latentloop.models.huginn_format import read_safetensors_folder
from latentloop.nn import RotaryEmbedding

if TYPE_CHECKING:
    from latentloop.models.ouro import OuroConfig, OuroLM

# official suffix inside ``model.layers.{i}.`` -> latentloop's (for the keys that are only renamed)
RENAMED = {
    "self_attn.o_proj.weight": "attn.proj.weight",
    "mlp.down_proj.weight": "mlp.proj.weight",
    "input_layernorm.weight": "norm_1.weight",
    "input_layernorm_2.weight": "norm_2.weight",
    "post_attention_layernorm.weight": "norm_3.weight",
    "post_attention_layernorm_2.weight": "norm_4.weight",
}
# latentloop's fused matrix -> the official matrices stacked in it, in order
FUSED = {
    "attn.Wqkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.fc.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def to_official(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """latentloop's state dict -> official key names (fused matrices split)."""
    out = {k: v for k, v in state.items() if not k.startswith("model.layers.")}
    for i in range(layers):
        prefix = f"model.layers.{i}."
        for official, ours in RENAMED.items():
            out[prefix + official] = state[prefix + ours]
        for ours, parts in FUSED.items():
            for name, piece in zip(parts, state[prefix + ours].chunk(len(parts), dim=0), strict=True):
                out[prefix + name] = piece
    return out


def from_official(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Official key names -> latentloop's state dict (projections fused)."""
    out = {k: v for k, v in state.items() if not k.startswith("model.layers.")}
    for i in range(layers):
        prefix = f"model.layers.{i}."
        for official, ours in RENAMED.items():
            out[prefix + ours] = state[prefix + official]
        for ours, parts in FUSED.items():
            out[prefix + ours] = torch.cat([state[prefix + name] for name in parts], dim=0)
    return out


def load_ouro(
    cls: type[OuroLM],
    config: OuroConfig,
    path: Path,
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
) -> OuroLM:
    """Build the model of ``config`` and load its weights from ``path``, checking every key and shape."""
    state = read_safetensors_folder(path)
    with torch.device("meta"):
        model = cls(config)
    layers = config.num_hidden_layers
    expected = to_official(model.state_dict(), layers)
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
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
    target = dtype or state["model.embed_tokens.weight"].dtype
    tensors = {k: v.to(device=device, dtype=target) for k, v in from_official(state, layers).items()}
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Non-persistent buffers (rotary tables) were built on the meta device: rebuild them for real.
    model.rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta).to(
        device
    )
    return model.eval()


def save_ouro(model: OuroLM, path: Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``path``; the folder is replaced only when complete."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} exists and is not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    state = to_official(state, model.config.num_hidden_layers)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    temp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            str(temp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (temp / "config.json").write_text(json.dumps(model.config.to_ouro_dict(), indent=2))
        if path.exists():
            for item in temp.iterdir():
                item.replace(path / item.name)
            temp.rmdir()
        else:
            temp.rename(path)
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)
