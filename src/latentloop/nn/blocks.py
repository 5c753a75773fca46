"""Transformer block layouts: sandwich (huginn), pre-norm and post-norm (attention + gated MLP), and a post-norm
block that mixes along the sequence with a gated MLP."""

from __future__ import annotations

import torch
from torch import nn

from latentloop.nn.attention import Attention, KVHook
from latentloop.nn.mlp import GatedMLP
from latentloop.nn.norm import RMSNorm


class Block(nn.Module):
    """Base of every layer block: the unit :func:`compile_blocks` compiles."""


class _Block(Block):
    def __init__(
        self,
        dim: int,
        n_heads: int,
        hidden: int,
        eps: float = 1e-6,
        qk_bias: bool = False,
        bias: bool = False,
        norm_weight: bool = True,
        rope_halves: bool = False,
    ) -> None:
        super().__init__()
        self.attn = Attention(dim, n_heads, qk_bias=qk_bias, bias=bias, rope_halves=rope_halves)
        self.mlp = GatedMLP(dim, hidden, bias=bias)


class SandwichBlock(_Block):
    """``x = n2(x + Attn(n1(x)))``; ``x = n4(x + MLP(n3(x)))``."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        hidden: int,
        eps: float = 1e-6,
        qk_bias: bool = False,
        bias: bool = False,
        norm_weight: bool = True,
        rope_halves: bool = False,
    ):
        super().__init__(dim, n_heads, hidden, eps, qk_bias, bias, norm_weight, rope_halves)
        self.norm_1 = RMSNorm(dim, eps, norm_weight)
        self.norm_2 = RMSNorm(dim, eps, norm_weight)
        self.norm_3 = RMSNorm(dim, eps, norm_weight)
        self.norm_4 = RMSNorm(dim, eps, norm_weight)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = True,
        kv_hook: KVHook | None = None,
    ) -> torch.Tensor:
        x = self.norm_2(x + self.attn(self.norm_1(x), rope, mask, causal, kv_hook))
        return self.norm_4(x + self.mlp(self.norm_3(x)))


class PreNormBlock(_Block):
    """``x = x + Attn(n1(x))``; ``x = x + MLP(n2(x))``."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        hidden: int,
        eps: float = 1e-6,
        qk_bias: bool = False,
        bias: bool = False,
        norm_weight: bool = True,
        rope_halves: bool = False,
    ):
        super().__init__(dim, n_heads, hidden, eps, qk_bias, bias, norm_weight, rope_halves)
        self.norm_1 = RMSNorm(dim, eps, norm_weight)
        self.norm_2 = RMSNorm(dim, eps, norm_weight)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = True,
        kv_hook: KVHook | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), rope, mask, causal, kv_hook)
        return x + self.mlp(self.norm_2(x))


class PostNormBlock(_Block):
    """``x = n1(x + Attn(x))``; ``x = n2(x + MLP(x))`` (the HRM/TRM layout)."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        hidden: int,
        eps: float = 1e-6,
        qk_bias: bool = False,
        bias: bool = False,
        norm_weight: bool = True,
        rope_halves: bool = False,
    ):
        super().__init__(dim, n_heads, hidden, eps, qk_bias, bias, norm_weight, rope_halves)
        self.norm_1 = RMSNorm(dim, eps, norm_weight)
        self.norm_2 = RMSNorm(dim, eps, norm_weight)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = True,
        kv_hook: KVHook | None = None,
    ) -> torch.Tensor:
        x = self.norm_1(x + self.attn(x, rope, mask, causal, kv_hook))
        return self.norm_2(x + self.mlp(x))


class PeriNormBlock(SandwichBlock):
    """``x = x + n2(Attn(n1(x)))``; ``x = x + n4(MLP(n3(x)))``: the sandwich's four norms and parameters, but
    the residual stream itself is never normalised (Ouro's layer: each branch is normed on its way in and out)."""

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = True,
        kv_hook: KVHook | None = None,
    ) -> torch.Tensor:
        x = x + self.norm_2(self.attn(self.norm_1(x), rope, mask, causal, kv_hook))
        return x + self.norm_4(self.mlp(self.norm_3(x)))


BLOCKS = {"sandwich": SandwichBlock, "pre-norm": PreNormBlock, "post-norm": PostNormBlock}


class SequenceMLPBlock(Block):
    """A post-norm block whose token mixer is a gated MLP *over the sequence* (TRM's Sudoku variant).

    ``mix_hidden`` is the width of the sequence MLP (default ``2 * seq_len``). ``sequence_norm`` normalises the
    mixer's residual over the sequence axis instead of the feature axis, as the official ``mlp_t`` does.
    """

    def __init__(
        self,
        seq_len: int,
        dim: int,
        hidden: int,
        eps: float,
        mix_hidden: int = 0,
        sequence_norm: bool = False,
        norm_weight: bool = True,
    ) -> None:
        super().__init__()
        self.sequence_norm = sequence_norm
        self.mix = GatedMLP(seq_len, mix_hidden or 2 * seq_len)
        self.mlp = GatedMLP(dim, hidden)
        self.norm_1 = RMSNorm(seq_len if sequence_norm else dim, eps, norm_weight)
        self.norm_2 = RMSNorm(dim, eps, norm_weight)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor | None = None, causal: bool = False
    ) -> torch.Tensor:
        if self.sequence_norm:
            x_t = x.transpose(1, 2)
            x = self.norm_1(x_t + self.mix(x_t)).transpose(1, 2)
        else:
            x = self.norm_1(x + self.mix(x.transpose(1, 2)).transpose(1, 2))
        return self.norm_2(x + self.mlp(x))


def compile_blocks(model: nn.Module) -> int:
    """Compile every :class:`Block` of ``model`` in place with ``torch.compile``; returns how many.

    Blocks are compiled one by one rather than the whole model: a block's graph is the same at every depth
    and every supervision step, so a recurrent model's varying loop counts cause no recompilation, and the
    weights keep their names, so checkpoints are unchanged. What compiling gains is the fusion of a block's
    elementwise operations (norms, gating, residuals); the matrix products run as before.
    """
    blocks = [module for module in model.modules() if isinstance(module, Block)]
    for block in blocks:
        block.compile()
    return len(blocks)
