"""The two looped-LM families as vLLM models: the recurrent-depth LM in the huginn-0125 layout and Ouro in the
official layout, written with vLLM's parallel layers and paged attention, so that ``vllm serve FOLDER`` batches
them continuously and spreads them over devices with vLLM's own tensor parallelism.

Looping reuses the weights of a layer at every step, and each step keeps its own keys and values (as the
references' caches do): step ``t`` of core layer ``j`` attends through its own :class:`Attention`, so vLLM
allocates one paged cache per (layer, step). The depth is fixed when the model loads (``mean_recurrence``, or
Ouro's ``total_ut_steps``, set with ``--hf-overrides``): vLLM gives a model's forward a flat batch of tokens and
no per-request fields, and allocates the caches once. What varies per token and can be done exactly inside one
batch does: Ouro's exit gate reads each token from the step where its cumulative exit probability reaches
``early_exit_threshold``, after every step has run for every token (the reference's rule; latentloop's
``gate-full`` exit).

The equations are those of :mod:`latentloop.models.recurrent_depth` and :mod:`latentloop.models.ouro`, with
latentloop's own norms and rotary embedding, so vLLM's greedy tokens are latentloop's ``generate``'s.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

from latentloop.errors import UsageError
from latentloop.models.ouro import exit_distribution, threshold_exit_steps
from latentloop.models.ouro_format import FUSED, RENAMED
from latentloop.nn import RMSNorm, RotaryEmbedding
from latentloop.nn.rope import apply_rope


class LoopedAttention(nn.Module):
    """Self-attention whose projections are shared by every loop step, with one vLLM :class:`Attention` (one
    paged cache) per step, named by ``layer_names``. ``qk_bias``: huginn's learned offset added to queries and
    keys before RoPE."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        layer_names: list[str],
        vllm_config: VllmConfig,
        *,
        qk_bias: bool = False,
        rope_halves: bool = False,
        prefix: str = "",
    ) -> None:
        super().__init__()
        world = get_tensor_model_parallel_world_size()
        if n_heads % world:
            raise UsageError(f"{n_heads} attention heads do not split over {world} tensor-parallel ranks")
        self.n_heads, self.head_dim, self.rope_halves = n_heads // world, dim // n_heads, rope_halves
        self.Wqkv = QKVParallelLinear(dim, self.head_dim, n_heads, bias=False, prefix=f"{prefix}.Wqkv")
        self.proj = RowParallelLinear(dim, dim, bias=False, prefix=f"{prefix}.proj")
        self.qk_bias = None
        if qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, self.n_heads, self.head_dim), requires_grad=False)
            self.qk_bias.weight_loader = self._load_qk_bias
        self.steps = nn.ModuleList(
            Attention(
                self.n_heads,
                self.head_dim,
                self.head_dim**-0.5,
                cache_config=vllm_config.cache_config,
                prefix=name,
            )
            for name in layer_names
        )

    def _load_qk_bias(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        rank = get_tensor_model_parallel_rank()
        param.data.copy_(loaded.narrow(2, rank * self.n_heads, self.n_heads))

    def forward(self, x: torch.Tensor, rope: torch.Tensor, step: int) -> torch.Tensor:
        tokens = x.shape[0]
        qkv, _ = self.Wqkv(x)
        q, k, v = qkv.view(tokens, 3, self.n_heads, self.head_dim).unbind(1)
        if self.qk_bias is not None:
            q, k = q + self.qk_bias[0, 0], k + self.qk_bias[1, 0]
        q, k = apply_rope(q, rope, self.rope_halves), apply_rope(k, rope, self.rope_halves)
        out = self.steps[step](q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1))
        return self.proj(out)[0]


class GatedMLP(nn.Module):
    """``proj(silu(gate) * up)``, the gate and up projections merged and split over the tensor-parallel ranks."""

    def __init__(self, dim: int, hidden: int, prefix: str = "") -> None:
        super().__init__()
        self.fc = MergedColumnParallelLinear(dim, [hidden, hidden], bias=False, prefix=f"{prefix}.fc")
        self.proj = RowParallelLinear(hidden, dim, bias=False, prefix=f"{prefix}.proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x)[0].chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)[0]


class LoopedBlock(nn.Module):
    """A layer with four RMSNorms: ``sandwich`` (huginn: ``x = n2(x + Attn(n1 x))``, ``x = n4(x + MLP(n3 x))``)
    or ``peri-norm`` (Ouro: ``x = x + n2(Attn(n1 x))``, ``x = x + n4(MLP(n3 x))``)."""

    def __init__(
        self,
        layout: str,
        dim: int,
        n_heads: int,
        hidden: int,
        eps: float,
        attention: LoopedAttention,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.layout = layout
        self.attn = attention
        self.mlp = GatedMLP(dim, hidden, prefix=f"{prefix}.mlp")
        self.norm_1, self.norm_2, self.norm_3, self.norm_4 = (RMSNorm(dim, eps) for _ in range(4))

    def forward(self, x: torch.Tensor, rope: torch.Tensor, step: int = 0) -> torch.Tensor:
        if self.layout == "sandwich":
            x = self.norm_2(x + self.attn(self.norm_1(x), rope, step))
            return self.norm_4(x + self.mlp(self.norm_3(x)))
        x = x + self.norm_2(self.attn(self.norm_1(x), rope, step))
        return x + self.norm_4(self.mlp(self.norm_3(x)))


class _AttentionNames:
    """Hands out the names of vLLM's attention layers: ``attention.{n}``, one number each, as vLLM reads a
    layer's index from its name."""

    def __init__(self) -> None:
        self.count = 0

    def take(self, steps: int) -> list[str]:
        names = [f"attention.{self.count + i}" for i in range(steps)]
        self.count += steps
        return names


class _LoopedForCausalLM(nn.Module):
    """What both families share in vLLM: the vocabulary-parallel embedding and head, logits, weight loading."""

    def _init_head(self, vocab: int, dim: int, tied: bool, embedding: VocabParallelEmbedding) -> None:
        self.lm_head = ParallelLMHead(vocab, dim, prefix="lm_head")
        if tied:
            self.lm_head = self.lm_head.tie_weights(embedding)
        self.logits_processor = LogitsProcessor(vocab)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def checkpoint_names(self, name: str) -> list[tuple[str, str | int | None]]:
        """(parameter, shard) for checkpoint tensor ``name``; a fused tensor names the pieces it splits into, in
        order."""
        return [(name, None)]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if name in self.IGNORED:
                continue
            targets = self.checkpoint_names(name)
            pieces = tensor.chunk(len(targets), dim=0) if len(targets) > 1 else [tensor]
            for (param_name, shard), piece in zip(targets, pieces, strict=True):
                if param_name not in params:
                    raise UsageError(f"unexpected weight {name!r} for {type(self).__name__}")
                param = params[param_name]
                loader = getattr(param, "weight_loader", default_weight_loader)
                if shard is None:
                    loader(param, piece)
                else:
                    loader(param, piece, shard)
                loaded.add(param_name)
        if self.tied:
            loaded.add("lm_head.weight")
        missing = sorted(set(params) - loaded)
        if missing:
            raise UsageError(f"weights are missing {missing[0]!r} ({len(missing)} missing in all)")
        return loaded

    IGNORED: frozenset[str] = frozenset()
    tied = False


class HuginnForCausalLM(_LoopedForCausalLM):
    """The recurrent-depth LM (huginn-0125 layout) at the depth ``mean_recurrence`` of its config.

    ``e = P(x)``; ``s_0 = 0``; ``s_i = R(e, s_{i-1})`` for i = 1..r; ``p = head(ln_f(C(ln_f(s_r))))``. The
    initial state is zero (latentloop's ``init_scale=0``): the same tokens on every run, in any batch.
    """

    IGNORED = frozenset({"freqs_cis"})

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        h, heads, eps = config.n_embd, config.n_heads, config.norm_eps
        self.depth = int(config.mean_recurrence)
        if self.depth < 1:
            raise UsageError(f"mean_recurrence must be at least 1, got {self.depth}")
        if config.bias:
            raise UsageError("huginn checkpoints with bias=true are not supported")
        names = _AttentionNames()

        def block(part: str, index: int, steps: int) -> LoopedBlock:
            where = f"transformer.{part}.{index}"
            attention = LoopedAttention(
                h, heads, names.take(steps), vllm_config, qk_bias=config.qk_bias, prefix=where
            )
            return LoopedBlock("sandwich", h, heads, config.intermediate_size, eps, attention, prefix=where)

        self.transformer = nn.ModuleDict(
            dict(
                wte=VocabParallelEmbedding(config.vocab_size, h),
                prelude=nn.ModuleList(block("prelude", i, 1) for i in range(config.n_layers_in_prelude)),
                adapter=ReplicatedLinear(2 * h, h, bias=False, prefix="transformer.adapter"),
                core_block=nn.ModuleList(
                    block("core_block", j, self.depth) for j in range(config.n_layers_in_recurrent_block)
                ),
                coda=nn.ModuleList(block("coda", i, 1) for i in range(config.n_layers_in_coda)),
                ln_f=RMSNorm(h, eps),
            )
        )
        self.tied = bool(config.tie_embeddings)
        self._init_head(config.vocab_size, h, self.tied, self.transformer.wte)
        self.rope = RotaryEmbedding(h // heads, config.block_size, config.rope_base)
        self.emb_scale = h**0.5

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.transformer.wte(input_ids) * self.emb_scale

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: object = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rope = self.rope.rotations[positions][:, None]  # [tokens, 1, head_dim / 2, 2]
        x = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        for layer in self.transformer.prelude:
            x = layer(x, rope)
        embeds, state = x, torch.zeros_like(x)
        for step in range(self.depth):
            x = self.transformer.adapter(torch.cat([state, embeds], dim=-1))[0]
            for layer in self.transformer.core_block:
                x = layer(x, rope, step)
            state = x
        x = self.transformer.ln_f(state)
        for layer in self.transformer.coda:
            x = layer(x, rope)
        return self.transformer.ln_f(x)

    def checkpoint_names(self, name: str) -> list[tuple[str, str | int | None]]:
        if name.endswith("attn.Wqkv.weight"):
            return [(name, "q"), (name, "k"), (name, "v")]
        if name.endswith("mlp.fc.weight"):
            return [(name, 0), (name, 1)]
        return [(name, None)]


class OuroForCausalLM(_LoopedForCausalLM):
    """Ouro (official layout) at ``total_ut_steps`` loop steps.

    ``h_t = norm(L_N(... L_1(h_{t-1})))`` from ``h_0 = E(x)``; each token's logits are read from the first step
    whose cumulative exit probability reaches ``early_exit_threshold`` (the last step when it is unset).
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        h, heads, eps = config.hidden_size, config.num_attention_heads, config.rms_norm_eps
        self.depth = int(config.total_ut_steps)
        if self.depth < 1:
            raise UsageError(f"total_ut_steps must be at least 1, got {self.depth}")
        threshold = getattr(config, "early_exit_threshold", None)
        if threshold is not None and not 0 < float(threshold) <= 1:
            raise UsageError(f"early_exit_threshold must be in (0, 1], got {threshold}")
        self.threshold = None if threshold is None else float(threshold)
        names = _AttentionNames()

        def layer(index: int) -> LoopedBlock:
            where = f"model.layers.{index}"
            attention = LoopedAttention(
                h, heads, names.take(self.depth), vllm_config, rope_halves=True, prefix=where
            )
            return LoopedBlock("peri-norm", h, heads, config.intermediate_size, eps, attention, prefix=where)

        self.model = nn.ModuleDict(
            dict(
                embed_tokens=VocabParallelEmbedding(config.vocab_size, h),
                layers=nn.ModuleList(layer(i) for i in range(config.num_hidden_layers)),
                norm=RMSNorm(h, eps),
                early_exit_gate=ReplicatedLinear(h, 1, bias=True, prefix="model.early_exit_gate"),
            )
        )
        self.tied = bool(config.tie_word_embeddings)
        self._init_head(config.vocab_size, h, self.tied, self.model.embed_tokens)
        self.rope = RotaryEmbedding(h // heads, config.max_position_embeddings, config.rope_theta)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: object = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rope = self.rope.rotations[positions][:, None]
        state = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        states, lambdas = [], []
        for step in range(self.depth):
            x = state
            for block in self.model.layers:
                x = block(x, rope, step)
            state = self.model.norm(x)
            states.append(state)
            lambdas.append(torch.sigmoid(self.model.early_exit_gate(state)[0].squeeze(-1).float()))
        if self.threshold is None or self.depth == 1:
            return state
        chosen = threshold_exit_steps(exit_distribution(torch.stack(lambdas, dim=-1)), self.threshold)
        stacked = torch.stack(states, dim=1)  # [tokens, steps, h]
        return stacked.gather(1, chosen[:, None, None].expand(-1, 1, stacked.shape[-1])).squeeze(1)

    def checkpoint_names(self, name: str) -> list[tuple[str, str | int | None]]:
        if not name.startswith("model.layers."):
            return [(name, None)]
        index, _, suffix = name.removeprefix("model.layers.").partition(".")
        where = f"model.layers.{index}."
        for fused, parts in FUSED.items():
            if suffix in parts:
                piece = parts.index(suffix)
                return [(where + fused, "qkv"[piece] if fused == "attn.Wqkv.weight" else piece)]
        return [(where + RENAMED.get(suffix, suffix), None)]
