"""Recurrent-depth language model (Geiping et al. 2025, "huginn-0125").

    e   = P(x)                                  prelude on the scaled token embedding
    s_0 ~ TruncNormal(0, sqrt(2 / 5h)) * sqrt(h) random initial state (zeros with init_scale = 0)
    s_i = R(e, s_{i-1}),  i = 1..r              core: adapter(concat[s, e]) then l_R sandwich layers
    p   = head(ln_f(C(ln_f(s_r))))              coda, the same ln_f again, embedding-tied head

Config field names and state-dict keys follow the public huginn-0125 checkpoint, so a local copy of it loads
with :meth:`RecurrentDepthLM.from_pretrained` and :meth:`save_pretrained` writes the same layout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from latentloop.config import from_dict
from latentloop.data.labels import IGNORE_LABEL
from latentloop.hub import PushToHub, lm_model_card, read_config_json, resolve_model, write_model_card
from latentloop.models.generation import generate
from latentloop.models.huginn_format import load_huginn, save_huginn
from latentloop.models.kv_cache import LayerKey, RecurrentKVCache
from latentloop.models.looped import LoopSpec
from latentloop.nn import Linear, RMSNorm, RotaryEmbedding, SandwichBlock
from latentloop.nn.rope import huginn_freqs_cis


@dataclass
class RecurrentDepthConfig:
    """Sizes and training defaults, named as in the huginn-0125 ``config.json``."""

    n_embd: int = 256
    n_heads: int = 4
    n_layers_in_prelude: int = 1
    n_layers_in_recurrent_block: int = 2
    n_layers_in_coda: int = 1
    intermediate_size: int = 704
    vocab_size: int = 512
    block_size: int = 512
    rope_base: float = 50_000.0
    norm_eps: float = 1e-6
    mean_recurrence: int = 8
    mean_backprop_depth: int = 4
    sampling_scheme: str = "poisson-lognormal"
    tie_embeddings: bool = True
    qk_bias: bool = True
    bias: bool = False
    activation_checkpointing: bool = False
    model_type: str = "huginn_raven"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = {
            "n_embd": self.n_embd,
            "n_heads": self.n_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "n_layers_in_recurrent_block": self.n_layers_in_recurrent_block,
            "mean_recurrence": self.mean_recurrence,
        }
        for name, value in checks.items():
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        for name in ("n_layers_in_prelude", "n_layers_in_coda", "mean_backprop_depth"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.n_embd % self.n_heads or (self.n_embd // self.n_heads) % 2:
            raise ValueError(f"n_embd {self.n_embd} must split into {self.n_heads} heads of even size")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def effective_expected_depth(self) -> int:
        return (
            self.n_layers_in_prelude
            + self.n_layers_in_coda
            + self.n_layers_in_recurrent_block * self.mean_recurrence
        )

    # huginn config.json <-> config ------------------------------------------------------------------------------
    _ALIASES: ClassVar[dict[str, str]] = {
        "num_attention_heads": "n_heads",
        "hidden_size": "n_embd",
        "padded_vocab_size": "vocab_size",
    }

    @classmethod
    def from_huginn_dict(cls, data: dict[str, Any]) -> RecurrentDepthConfig:
        """Read a huginn-style ``config.json`` mapping; keys this model does not use are kept in ``extra``."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known, extra = {}, {}
        for key, value in data.items():
            target = cls._ALIASES.get(key, key)
            if target in names and target not in known:
                known[target] = value
            else:
                extra[key] = value
        if "sampling_scheme" in known and str(known["sampling_scheme"]).startswith("poisson-lognormal"):
            known["sampling_scheme"] = "poisson-lognormal"
        return from_dict(cls, {**known, "extra": extra})

    def to_huginn_dict(self) -> dict[str, Any]:
        """The ``config.json`` mapping in the huginn-0125 layout."""
        data = {
            "architectures": ["RavenForCausalLM"],
            "model_type": self.model_type,
            "n_embd": self.n_embd,
            "n_heads": self.n_heads,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_heads,
            "n_layers": self.n_layers_in_prelude + self.n_layers_in_recurrent_block + self.n_layers_in_coda,
            "n_layers_in_prelude": self.n_layers_in_prelude,
            "n_layers_in_recurrent_block": self.n_layers_in_recurrent_block,
            "n_layers_in_coda": self.n_layers_in_coda,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "padded_vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "rope_base": self.rope_base,
            "norm_eps": self.norm_eps,
            "mean_recurrence": self.mean_recurrence,
            "mean_backprop_depth": self.mean_backprop_depth,
            "sampling_scheme": self.sampling_scheme,
            "tie_embeddings": self.tie_embeddings,
            "qk_bias": self.qk_bias,
            "bias": self.bias,
            "block_class_name": "SandwichBlock",
            "norm_class_name": "RMSNorm_llama",
            "mlp_class_name": "GatedMLP",
            "nonlin_name": "SiLU",
            "injection_type": "linear",
            "state_init": "like-init",
        }
        # The reference config class sets tie_word_embeddings itself and fails if it arrives twice.
        extra = {k: v for k, v in self.extra.items() if k != "tie_word_embeddings"}
        return {**extra, **data}


@dataclass
class RecurrentDepthOutput:
    """What a forward pass returns. ``latent_states`` is the final core state (before ``ln_f``);
    ``trajectory`` holds the state after every core iteration when requested ([r, B, T, h])."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    latent_states: torch.Tensor | None = None
    trajectory: torch.Tensor | None = None
    num_steps: tuple[int, int] = (0, 0)


@dataclass
class StepContext:
    """Per-call positions, mask and cache shared by the prelude, each core iteration and the coda."""

    rope: torch.Tensor
    mask: torch.Tensor | None
    cache: RecurrentKVCache | None = None
    start: int = 0
    rows: torch.Tensor | None = None  # rows allowed to write the cache (None = all)

    def hook(self, part: str, layer: int, slot: int = 0):
        if self.cache is None:
            return None
        return self.cache.hook(LayerKey(part, layer, slot), self.start, self.rows)


def step_context(
    rope: RotaryEmbedding,
    device: torch.device,
    length: int,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: RecurrentKVCache | None = None,
    rows: torch.Tensor | None = None,
    start: int | None = None,
) -> StepContext:
    """Positions and mask for ``length`` new tokens after what ``cache`` holds, rotated by ``rope``.

    ``attention_mask`` ([B, past + length], 1 = token, 0 = padding) masks padded keys; positions then count
    only real tokens, so a left-padded row sees exactly what it would alone. ``start``: the position of the
    first of them, where it is not the cache's length (a decoder that finishes earlier positions' iterations
    later writes them at their own positions).
    """
    if start is None:
        start = cache.length if cache is not None else 0
    mask = None
    if attention_mask is not None:
        attention_mask = attention_mask.to(device=device, dtype=torch.bool)
        total = attention_mask.shape[1]
        if total != start + length:
            raise ValueError(f"attention_mask covers {total} positions, expected {start + length}")
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:]
        if not bool(attention_mask.all()):
            query = torch.arange(start, start + length, device=device)[:, None]
            key = torch.arange(total, device=device)[None, :]
            causal = key <= query
            # A padded query attends to itself only, so its (discarded) output stays finite.
            mask = (causal[None] & attention_mask[:, None, :]) | (key == query)[None]
            mask = mask[:, None]
    if position_ids is None:
        position_ids = torch.arange(start, start + length, device=device)
    return StepContext(rope.tables(position_ids), mask, cache, start, rows)


class RecurrentDepthLM(PushToHub, nn.Module):
    """Prelude, a core block looped ``num_steps`` times, coda; see the module docstring for the equations."""

    loop: ClassVar[LoopSpec] = LoopSpec(
        prelude=True, coda=True, input_injection=True, random_initial_state=True, exit_gate=False
    )

    def __init__(self, config: RecurrentDepthConfig) -> None:
        super().__init__()
        self.config = config
        h = config.n_embd

        def block() -> SandwichBlock:
            return SandwichBlock(
                h, config.n_heads, config.intermediate_size, config.norm_eps, config.qk_bias, config.bias
            )

        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, h),
                prelude=nn.ModuleList(block() for _ in range(config.n_layers_in_prelude)),
                adapter=Linear(2 * h, h, bias=config.bias),
                core_block=nn.ModuleList(block() for _ in range(config.n_layers_in_recurrent_block)),
                coda=nn.ModuleList(block() for _ in range(config.n_layers_in_coda)),
                ln_f=RMSNorm(h, config.norm_eps),
            )
        )
        self.lm_head = Linear(h, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.rope = RotaryEmbedding(config.head_dim, config.block_size, config.rope_base)
        self.emb_scale = math.sqrt(h)
        self.init_std = math.sqrt(2 / (5 * h))
        self.reset_parameters()

    # Initialisation (the "takase" scheme of the reference: small std, output projections scaled by depth) -----
    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.init_std
        out_std = std / math.sqrt(2 * self.config.effective_expected_depth)

        def normal(tensor: torch.Tensor, s: float) -> None:
            nn.init.trunc_normal_(tensor, std=s, a=-3 * s, b=3 * s)

        for name, module in self.named_modules():
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, nn.Linear):
                if name.endswith("mlp.fc"):
                    gate, up = module.weight.chunk(2, dim=0)
                    normal(gate, std)
                    normal(up, out_std)
                elif name.endswith("proj"):
                    normal(module.weight, out_std)
                else:
                    normal(module.weight, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                normal(module.weight, std)
            if getattr(module, "qk_bias", None) is not None:
                nn.init.zeros_(module.qk_bias)

    @property
    def embedding(self) -> nn.Embedding:
        """The token embedding (its weight tells generation the model's device and dtype)."""
        return self.transformer.wte

    # The pieces of one forward pass (generation composes them one iteration at a time) ----------------------
    def context(
        self,
        length: int,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: RecurrentKVCache | None = None,
        rows: torch.Tensor | None = None,
        start: int | None = None,
    ) -> StepContext:
        """Positions and mask for ``length`` new tokens after what ``cache`` holds, or from ``start`` (see
        :func:`step_context`)."""
        return step_context(
            self.rope,
            self.transformer.wte.weight.device,
            length,
            attention_mask,
            position_ids,
            cache,
            rows,
            start,
        )

    def embed(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``e = P(x)``: scaled token embedding through the prelude."""
        x = self.transformer.wte(input_ids) * self.emb_scale
        for i, layer in enumerate(self.transformer.prelude):
            x = layer(x, ctx.rope, ctx.mask, True, ctx.hook("prelude", i))
        return x

    def initialize_state(self, embeds: torch.Tensor, init_scale: float = 1.0) -> torch.Tensor:
        """``s_0``: truncated normal (std ``sqrt(2/5h)`` at 3 std) times ``sqrt(h)``; zeros for ``init_scale=0``."""
        std = self.init_std * init_scale
        state = torch.zeros_like(embeds)
        if std > 0:
            nn.init.trunc_normal_(state, std=std, a=-3 * std, b=3 * std)
            state = state * self.emb_scale
        return state

    def core_step(
        self, state: torch.Tensor, embeds: torch.Tensor, ctx: StepContext, iteration: int
    ) -> torch.Tensor:
        """``s_i = R(e, s_{i-1})``: the adapter on ``concat[s, e]`` then the core's sandwich layers."""
        x = self.transformer.adapter(torch.cat([state, embeds], dim=-1))
        slot = ctx.cache.slot(iteration) if ctx.cache is not None else 0
        for j, layer in enumerate(self.transformer.core_block):
            x = layer(x, ctx.rope, ctx.mask, True, ctx.hook("core", j, slot))
        return x

    def head_input(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """What the output layer reads: ``ln_f(C(ln_f(s_r)))``, through the coda."""
        x = self.transformer.ln_f(state)
        for i, layer in enumerate(self.transformer.coda):
            x = layer(x, ctx.rope, ctx.mask, True, ctx.hook("coda", i))
        return self.transformer.ln_f(x)

    def predict(self, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``logits = head(ln_f(C(ln_f(s_r))))``, in fp32."""
        return self.lm_head(self.head_input(state, ctx)).float()

    def resolve_steps(self, num_steps: int | tuple[int, int] | None) -> tuple[int, int]:
        """(iterations without gradient, iterations with gradient) for a forward pass.

        ``None`` means the config's mean depth; an int ``r`` means ``r`` iterations of which the last
        ``mean_backprop_depth`` carry gradients when gradients are enabled; a pair is taken as given.
        """
        if num_steps is None:
            num_steps = self.config.mean_recurrence
        if isinstance(num_steps, (tuple, list)):
            no_grad, with_grad = (int(n) for n in num_steps)
        else:
            total = int(num_steps)
            with_grad = min(self.config.mean_backprop_depth, total) if torch.is_grad_enabled() else 0
            no_grad = total - with_grad
        if no_grad < 0 or with_grad < 0 or no_grad + with_grad < 1:
            raise ValueError(f"num_steps must be at least 1, got {num_steps}")
        return no_grad, with_grad

    def forward(
        self,
        input_ids: torch.Tensor,
        num_steps: int | tuple[int, int] | None = None,
        init_scale: float = 1.0,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        input_states: torch.Tensor | None = None,
        cache: RecurrentKVCache | None = None,
        return_trajectory: bool = False,
    ) -> RecurrentDepthOutput:
        """Logits for ``input_ids`` [B, T] at depth ``num_steps``.

        ``labels`` [B, T] are aligned with the positions (already shifted; ``IGNORE_LABEL`` is not scored). Gradients flow
        only through the last iterations (truncated backpropagation, see :meth:`resolve_steps`).
        """
        no_grad, with_grad = self.resolve_steps(num_steps)
        ctx = self.context(input_ids.shape[1], attention_mask, position_ids, cache)
        embeds = self.embed(input_ids, ctx)
        state = self.initialize_state(embeds, init_scale) if input_states is None else input_states
        trajectory = []
        with torch.no_grad():
            for i in range(no_grad):
                state = self.core_step(state, embeds, ctx, i)
                if return_trajectory:
                    trajectory.append(state)
        for i in range(no_grad, no_grad + with_grad):
            if self.config.activation_checkpointing and self.training:
                state = checkpoint(self.core_step, state, embeds, ctx, i, use_reentrant=False)
            else:
                state = self.core_step(state, embeds, ctx, i)
            if return_trajectory:
                trajectory.append(state)
        logits = self.predict(state, ctx)
        if cache is not None:
            cache.advance(input_ids.shape[1])
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.flatten(0, 1), labels.flatten().to(logits.device), ignore_index=IGNORE_LABEL
            )
        return RecurrentDepthOutput(
            logits=logits,
            loss=loss,
            latent_states=state,
            trajectory=torch.stack(trajectory) if return_trajectory else None,
            num_steps=(no_grad, with_grad),
        )

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Greedy (or sampled) continuation; see :func:`latentloop.models.generation.generate` for options."""
        return generate(self, input_ids, **kwargs).sequences

    # huginn-0125 checkpoint layout ----------------------------------------------------------------------------
    def huginn_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under huginn-0125 key names (``lm_head.weight`` left out when tied, ``freqs_cis`` included)."""
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_embeddings:
            state.pop("lm_head.weight", None)
        dtype = self.transformer.wte.weight.dtype
        state["freqs_cis"] = huginn_freqs_cis(
            self.config.head_dim, self.config.block_size, self.config.rope_base
        ).to(dtype)
        return state

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (huginn-0125 layout) into ``path``, atomically, with
        a Hub model card ``README.md``: the folder is ready for ``push_to_hub`` or ``hf upload``."""
        save_huginn(self, Path(path))
        write_model_card(path, self.model_card())

    def model_card(self, repo_id: str | None = None) -> str:
        """The ``README.md`` that :meth:`save_pretrained` writes (its usage names ``repo_id``)."""
        return lm_model_card(self.config, self.num_parameters(), repo_id)

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
    ) -> RecurrentDepthLM:
        """Load ``config.json`` and ``model.safetensors`` (or a sharded index) from a local folder, or from a
        Hub repository id ``org/name`` at ``revision`` through the Hugging Face cache (``cache_dir``,
        ``token``: see :func:`latentloop.hub.resolve_model`; a local folder of the same name wins)."""
        folder = resolve_model(path, revision=revision, cache_dir=cache_dir, token=token)
        return load_huginn(cls, load_config_json(folder), folder, dtype=dtype, device=device)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


def load_config_json(path: Path) -> RecurrentDepthConfig:
    """Parse ``path/config.json`` with one-line errors."""
    return read_config_json(path, RecurrentDepthConfig.from_huginn_dict)
