"""Ouro, the looped language model of ByteDance's "LoopLM" (Zhu et al. 2025, "Scaling Latent Reasoning via
Looped Language Models").

    h_0 = E(x)                                       the token embedding (no scaling, no prelude)
    h_t = norm(L_N(... L_1(h_{t-1}) ...)),  t = 1..T the whole stack of N layers, shared weights, then the final
                                                     norm, inside the loop: step t+1 reads the normalised h_t
    L(x): x = x + n2(Attn(n1(x))); x = x + n4(MLP(n3(x)))   four RMSNorms per layer (PeriNormBlock)
    λ_t = sigmoid(gate(h_t))                         the exit gate on each step's state
    p_t = λ_t Π_{s<t} (1 - λ_s),  p_T = Π_{s<T} (1 - λ_s)   the exit distribution; the last step takes the rest
    logits_t = head(h_t)

There is no input injection: a step reads only the previous step's state. Inference takes the logits of the
last step, of a fixed step, or of the first step whose cumulative exit probability reaches a threshold; training
takes the logits expected under p. Config keys and weight names follow the official Hub layout
(``configuration_ouro.py`` / ``modeling_ouro.py``, model_type ``ouro``), so a local copy or a Hub id of an Ouro
checkpoint loads with :meth:`OuroLM.from_pretrained`, and :meth:`OuroLM.save_pretrained` writes that layout back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.config import from_dict
from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import UsageError
from latentloop.hub import read_config_json, resolve_model
from latentloop.models.generation import generate
from latentloop.models.kv_cache import RecurrentKVCache
from latentloop.models.looped import LoopSpec
from latentloop.models.ouro_format import load_ouro, save_ouro
from latentloop.models.recurrent_depth import StepContext, step_context
from latentloop.nn import Linear, PeriNormBlock, RMSNorm, RotaryEmbedding

MODEL_TYPE = "ouro"


@dataclass
class OuroConfig:
    """Sizes, named as in the official ``config.json`` (defaults: a tiny model, not Ouro-1.4B)."""

    hidden_size: int = 256
    intermediate_size: int = 704
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    vocab_size: int = 512
    max_position_embeddings: int = 512
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    total_ut_steps: int = 4
    early_exit_threshold: float | None = 1.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    model_type: str = MODEL_TYPE
    extra: dict[str, Any] = field(default_factory=dict)

    # Keys a config.json must hold: without them the model's shape is unknown.
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    )

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("vocab_size", "max_position_embeddings", "total_ut_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads or self.head_dim % 2:
            raise ValueError(
                f"hidden_size {self.hidden_size} must split into {self.num_attention_heads} heads of even size"
            )

    # The names the looped-LM tools read (see latentloop.models.looped) ------------------------------------------
    @property
    def n_heads(self) -> int:
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def n_layers_in_recurrent_block(self) -> int:
        return self.num_hidden_layers

    @property
    def mean_recurrence(self) -> int:
        """The default depth: the config's ``total_ut_steps``."""
        return self.total_ut_steps

    @property
    def block_size(self) -> int:
        return self.max_position_embeddings

    # config.json <-> config ------------------------------------------------------------------------------------
    @classmethod
    def from_ouro_dict(cls, data: dict[str, Any]) -> OuroConfig:
        """Read an official ``config.json`` mapping; refuse what this model does not implement (grouped-query
        attention, sliding windows, scaled RoPE, another activation). Keys it does not use go to ``extra``."""
        kind = data.get("model_type")
        if kind != MODEL_TYPE:
            raise UsageError(f"model_type {kind!r} is not an Ouro model ({MODEL_TYPE!r})")
        missing = [key for key in cls.REQUIRED if key not in data]
        if missing:
            raise UsageError(f"missing config key {missing[0]!r}")
        heads = data["num_attention_heads"]
        unsupported = {
            "num_key_value_heads": data.get("num_key_value_heads", heads) not in (None, heads),
            "hidden_act": data.get("hidden_act", "silu") != "silu",
            "rope_scaling": data.get("rope_scaling") not in (None, {}),
            "use_sliding_window": bool(data.get("use_sliding_window", False)),
            "layer_types": any(kind != "full_attention" for kind in data.get("layer_types") or []),
            "head_dim": data.get("head_dim") not in (None, data["hidden_size"] // max(int(heads), 1)),
        }
        for key, refused in unsupported.items():
            if refused:
                raise UsageError(f"config key {key}={data[key]!r} is not supported")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        return from_dict(cls, {**known, "extra": extra})

    def to_ouro_dict(self) -> dict[str, Any]:
        """The ``config.json`` mapping in the official layout."""
        data = {
            "architectures": ["OuroForCausalLM"],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "rms_norm_eps": self.rms_norm_eps,
            "total_ut_steps": self.total_ut_steps,
            "early_exit_threshold": self.early_exit_threshold,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "use_sliding_window": False,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
        }
        return {**self.extra, **data}


@dataclass
class OuroOutput:
    """What a forward pass returns. ``latent_states``: the state the logits were read from (normalised);
    ``trajectory`` (on request): the state after every step [T, B, S, h]; ``exit_probabilities`` [B, S, T]: the
    gate's exit distribution p over the steps; ``exit_steps`` [B, S]: the step (0-based) each position's logits
    come from."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    latent_states: torch.Tensor | None = None
    trajectory: torch.Tensor | None = None
    exit_probabilities: torch.Tensor | None = None
    exit_steps: torch.Tensor | None = None


def exit_distribution(lambdas: torch.Tensor) -> torch.Tensor:
    """``p_t = λ_t Π_{s<t}(1 - λ_s)`` for t < T and ``p_T = Π_{s<T}(1 - λ_s)``, over the last axis of ``lambdas``."""
    remaining = torch.ones_like(lambdas[..., 0])
    steps = []
    last = lambdas.shape[-1] - 1
    for t in range(lambdas.shape[-1]):
        if t < last:
            steps.append(lambdas[..., t] * remaining)
            remaining = remaining * (1 - lambdas[..., t])
        else:
            steps.append(remaining)
    return torch.stack(steps, dim=-1)


def threshold_exit_steps(probabilities: torch.Tensor, threshold: float) -> torch.Tensor:
    """The first step whose cumulative exit probability reaches ``threshold`` (the last step if none does)."""
    reached = probabilities.cumsum(-1) >= threshold
    first = reached.float().argmax(-1)
    return torch.where(reached.any(-1), first, torch.full_like(first, probabilities.shape[-1] - 1))


class OuroLM(nn.Module):
    """The Ouro looped LM; see the module docstring for the equations."""

    loop: ClassVar[LoopSpec] = LoopSpec(
        prelude=False, coda=False, input_injection=False, random_initial_state=False, exit_gate=True
    )

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.model = nn.ModuleDict(
            dict(
                embed_tokens=nn.Embedding(config.vocab_size, h),
                layers=nn.ModuleList(
                    PeriNormBlock(
                        h,
                        config.num_attention_heads,
                        config.intermediate_size,
                        config.rms_norm_eps,
                        rope_halves=True,
                    )
                    for _ in range(config.num_hidden_layers)
                ),
                norm=RMSNorm(h, config.rms_norm_eps),
                early_exit_gate=Linear(h, 1),
            )
        )
        self.lm_head = Linear(h, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal weights of std ``initializer_range``, zero biases, unit norms (the reference's init)."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @property
    def embedding(self) -> nn.Embedding:
        """The token embedding (its weight tells generation the model's device and dtype)."""
        return self.model.embed_tokens

    # The pieces of one forward pass (see latentloop.models.looped) ---------------------------------------------
    def context(
        self,
        length: int,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: RecurrentKVCache | None = None,
        rows: torch.Tensor | None = None,
        start: int | None = None,
    ) -> StepContext:
        """Positions and mask for ``length`` new tokens after what ``cache`` holds, or from ``start`` (left
        padding is exact)."""
        return step_context(
            self.rope, self.embedding.weight.device, length, attention_mask, position_ids, cache, rows, start
        )

    def embed(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``h_0 = E(x)``: the plain token embedding."""
        return self.model.embed_tokens(input_ids)

    def initialize_state(self, embeds: torch.Tensor, init_scale: float = 1.0) -> torch.Tensor:
        """The loop starts from the embedding itself (``init_scale`` has nothing to scale)."""
        return embeds

    def core_step(
        self, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext, iteration: int
    ) -> torch.Tensor:
        """``h_t = norm(L_N(... L_1(h_{t-1})))``; the embedding is not injected again. Step ``iteration`` keeps its
        keys and values in its own cache slot per layer (the reference's entry ``step * N + layer``)."""
        slot = ctx.cache.slot(iteration) if ctx.cache is not None else 0
        x = state
        for j, layer in enumerate(self.model.layers):
            x = layer(x, ctx.rope, ctx.mask, True, ctx.hook("core", j, slot))
        return self.model.norm(x)

    def head_input(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """What the output layer reads: ``h_t`` itself (the state is already normalised; there is no coda)."""
        return state

    def predict(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``logits = head(h_t)`` in fp32."""
        return self.lm_head(self.head_input(state, ctx)).float()

    def exit_lambda(self, state: torch.Tensor) -> torch.Tensor:
        """``λ_t = sigmoid(gate(h_t))``, in fp32: ``state`` [..., h] -> [...]."""
        return torch.sigmoid(self.model.early_exit_gate(state).squeeze(-1).float())

    def resolve_steps(self, num_steps: int | None) -> int:
        """The depth of a forward pass: ``num_steps``, else the config's ``total_ut_steps``."""
        steps = self.config.total_ut_steps if num_steps is None else int(num_steps)
        if steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {num_steps}")
        return steps

    def forward(
        self,
        input_ids: torch.Tensor,
        num_steps: int | None = None,
        init_scale: float = 0.0,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: RecurrentKVCache | None = None,
        return_trajectory: bool = False,
        exit_step: int | None = None,
        exit_threshold: float | None = None,
    ) -> OuroOutput:
        """Logits for ``input_ids`` [B, S] after ``num_steps`` loop steps, read from the last step, from
        ``exit_step`` (0-based), or per position from the first step whose cumulative exit probability reaches
        ``exit_threshold``. With ``labels`` (aligned with the positions, already shifted) the loss is the
        cross-entropy of the logits expected under the exit distribution, as Ouro trains. ``init_scale`` is
        accepted for the looped-LM interface and has no effect."""
        steps = self.resolve_steps(num_steps)
        ctx = self.context(input_ids.shape[1], attention_mask, position_ids, cache)
        embeds = self.embed(input_ids, ctx)
        state = self.initialize_state(embeds, init_scale)
        states, lambdas = [], []
        for i in range(steps):
            state = self.core_step(state, embeds, ctx, i)
            states.append(state)
            lambdas.append(self.exit_lambda(state))
        if cache is not None:
            cache.advance(input_ids.shape[1])
        probabilities = exit_distribution(torch.stack(lambdas, dim=-1))
        if exit_step is not None:
            chosen = torch.full(probabilities.shape[:-1], min(exit_step, steps - 1), device=state.device)
        elif exit_threshold is not None:
            chosen = threshold_exit_steps(probabilities, exit_threshold)
        else:
            chosen = torch.full(probabilities.shape[:-1], steps - 1, device=state.device)
        stacked = torch.stack(states, dim=2)  # [B, S, T, h]
        selected = stacked.gather(2, chosen[..., None, None].expand(-1, -1, 1, stacked.shape[-1])).squeeze(2)
        loss = None
        if labels is not None:
            expected = sum(probabilities[..., t, None] * self.predict(s, ctx) for t, s in enumerate(states))
            logits = expected
            loss = F.cross_entropy(
                expected.flatten(0, 1), labels.flatten().to(expected.device), ignore_index=IGNORE_LABEL
            )
        else:
            logits = self.predict(selected, ctx)
        return OuroOutput(
            logits=logits,
            loss=loss,
            latent_states=selected,
            trajectory=torch.stack(states) if return_trajectory else None,
            exit_probabilities=probabilities,
            exit_steps=chosen,
        )

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Greedy (or sampled) continuation; see :func:`latentloop.models.generation.generate` for options."""
        return generate(self, input_ids, **kwargs).sequences

    # The official checkpoint layout ----------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` in the official layout into ``path``, atomically."""
        save_ouro(self, Path(path))

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: torch.dtype | None = torch.float32,
        device: str | torch.device = "cpu",
        *,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        token: str | bool | None = None,
    ) -> OuroLM:
        """Load ``config.json`` and ``model.safetensors`` (or the shards of ``model.safetensors.index.json``)
        from a local folder or a Hub id ``org/name`` (see :func:`latentloop.hub.resolve_model`)."""
        folder = resolve_model(path, revision=revision, cache_dir=cache_dir, token=token)
        return load_ouro(cls, read_ouro_config(folder), folder, dtype=dtype, device=device)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


def read_ouro_config(path: Path) -> OuroConfig:
    """Parse ``path/config.json`` as an Ouro config, with one-line errors."""
    return read_config_json(path, OuroConfig.from_ouro_dict)
