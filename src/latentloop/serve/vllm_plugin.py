"""latentloop's vLLM plugin (``pip install 'latentloop[vllm]'``): vLLM runs :func:`register` in each of its
processes through the ``vllm.general_plugins`` entry point, and then serves a folder in the huginn-0125 layout
(``RavenForCausalLM``) or in Ouro's official layout (``OuroForCausalLM``) with the models of
:mod:`latentloop.serve.vllm_models`.

transformers knows neither config: the two classes below read a ``config.json`` of either layout without remote
code, and name the sizes vLLM asks every config for (hidden size, heads, context, layers).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from vllm import ModelRegistry

from latentloop.models.ouro import OuroConfig as LatentloopOuroConfig
from latentloop.models.recurrent_depth import RecurrentDepthConfig

MODELS = {
    "RavenForCausalLM": "latentloop.serve.vllm_models:HuginnForCausalLM",
    "OuroForCausalLM": "latentloop.serve.vllm_models:OuroForCausalLM",
}


def defaults(config: type) -> dict[str, Any]:
    """The sizes latentloop's config dataclass ``config`` takes when a ``config.json`` leaves them out."""
    return {
        f.name: f.default
        for f in dataclasses.fields(config)
        if f.default is not dataclasses.MISSING and f.name not in ("model_type", "extra")
    }


class HuginnConfig(PretrainedConfig):
    """A huginn-0125 ``config.json`` (``model_type`` ``huginn_raven``), its keys kept as they are."""

    model_type = "huginn_raven"
    attribute_map = {  # noqa: RUF012 (transformers reads the class attribute)
        "hidden_size": "n_embd",
        "num_attention_heads": "n_heads",
        "max_position_embeddings": "block_size",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs = {**defaults(RecurrentDepthConfig), **kwargs}
        kwargs["vocab_size"] = kwargs.get("padded_vocab_size", kwargs["vocab_size"])
        kwargs["num_key_value_heads"] = kwargs["n_heads"]
        kwargs["head_dim"] = kwargs["n_embd"] // kwargs["n_heads"]
        # Every loop step keeps its own cache: vLLM counts the layers it allocates caches for.
        kwargs["num_hidden_layers"] = (
            kwargs["n_layers_in_prelude"]
            + kwargs["n_layers_in_recurrent_block"] * int(kwargs["mean_recurrence"])
            + kwargs["n_layers_in_coda"]
        )
        kwargs["tie_word_embeddings"] = bool(kwargs["tie_embeddings"])
        super().__init__(**kwargs)


class OuroConfig(PretrainedConfig):
    """An Ouro ``config.json`` (``model_type`` ``ouro``), its keys kept as they are."""

    model_type = "ouro"

    def __init__(self, **kwargs: Any) -> None:
        kwargs = {**defaults(LatentloopOuroConfig), **kwargs}
        kwargs.setdefault("num_key_value_heads", kwargs["num_attention_heads"])
        super().__init__(**kwargs)


def register() -> None:
    """Register both configs with transformers and both models with vLLM (models load lazily, by name)."""
    AutoConfig.register(HuginnConfig.model_type, HuginnConfig, exist_ok=True)
    AutoConfig.register(OuroConfig.model_type, OuroConfig, exist_ok=True)
    for architecture, model in MODELS.items():
        ModelRegistry.register_model(architecture, model)
