"""latentloop's vLLM plugin (``pip install 'latentloop[vllm]'``): vLLM runs :func:`register` in each of its
processes through the ``vllm.general_plugins`` entry point, and then serves a folder in the huginn-0125 layout
(``RavenForCausalLM``) or in Ouro's official layout (``OuroForCausalLM``) with the models of
:mod:`latentloop.serve.vllm_models`.

transformers knows neither config: the two classes below read a ``config.json`` of either layout without remote
code, and name the sizes vLLM asks every config for (hidden size, heads, context, layers).
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig
from vllm import ModelRegistry

MODELS = {
    "RavenForCausalLM": "latentloop.serve.vllm_models:HuginnForCausalLM",
    "OuroForCausalLM": "latentloop.serve.vllm_models:OuroForCausalLM",
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
        kwargs.setdefault("n_embd", 256)
        kwargs.setdefault("n_heads", 4)
        kwargs.setdefault("block_size", 512)
        kwargs.setdefault("mean_recurrence", 8)
        kwargs.setdefault("n_layers_in_prelude", 1)
        kwargs.setdefault("n_layers_in_recurrent_block", 2)
        kwargs.setdefault("n_layers_in_coda", 1)
        kwargs.setdefault("qk_bias", True)
        kwargs.setdefault("bias", False)
        kwargs.setdefault("norm_eps", 1e-6)
        kwargs.setdefault("rope_base", 50_000.0)
        kwargs["vocab_size"] = kwargs.get("padded_vocab_size", kwargs.get("vocab_size", 512))
        kwargs["num_key_value_heads"] = kwargs["n_heads"]
        kwargs["head_dim"] = kwargs["n_embd"] // kwargs["n_heads"]
        # Every loop step keeps its own cache: vLLM counts the layers it allocates caches for.
        kwargs["num_hidden_layers"] = (
            kwargs["n_layers_in_prelude"]
            + kwargs["n_layers_in_recurrent_block"] * int(kwargs["mean_recurrence"])
            + kwargs["n_layers_in_coda"]
        )
        kwargs["tie_word_embeddings"] = bool(kwargs.get("tie_embeddings", True))
        super().__init__(**kwargs)


class OuroConfig(PretrainedConfig):
    """An Ouro ``config.json`` (``model_type`` ``ouro``), its keys kept as they are."""

    model_type = "ouro"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("total_ut_steps", 4)
        kwargs.setdefault("early_exit_threshold", 1.0)
        kwargs.setdefault("rope_theta", 1_000_000.0)
        kwargs.setdefault("rms_norm_eps", 1e-6)
        kwargs.setdefault("num_key_value_heads", kwargs.get("num_attention_heads"))
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


def register() -> None:
    """Register both configs with transformers and both models with vLLM (models load lazily, by name)."""
    AutoConfig.register(HuginnConfig.model_type, HuginnConfig, exist_ok=True)
    AutoConfig.register(OuroConfig.model_type, OuroConfig, exist_ok=True)
    for architecture, model in MODELS.items():
        ModelRegistry.register_model(architecture, model)
