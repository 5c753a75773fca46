"""Multi-head self-attention: fused QKV, optional qk-bias added before RoPE, SDPA kernel, KV-cache hook."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.nn.linear import Linear
from latentloop.nn.rope import apply_rope

# Receives this call's keys and values [B, heads, S, head_dim]; returns all keys and values to attend to.
KVHook = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **options)``, in fp32 for bf16 inputs on a CPU.

    The CPU's bf16 attention kernels are far slower than its fp32 ones at the sizes latentloop trains (forward
    and backward 3-10x at 18-64 positions and heads of 16-32), while the matmuls around them gain from bf16;
    so under bf16 autocast the attention core alone runs in fp32 and returns bf16.
    """
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, **options)
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **options)
    return out.to(q.dtype)


class Attention(nn.Module):
    """Self-attention with one fused ``Wqkv`` projection and an output ``proj``.

    ``qk_bias`` ([2, 1, heads, head_dim]) is a learned offset added to queries and keys before the rotary
    embedding ``rope`` (the rotations of :meth:`RotaryEmbedding.tables`; ``rope_halves`` rotates the halves of
    each head rather than its adjacent pairs, see :func:`apply_rope`). ``mask`` is boolean (True = may attend) and broadcasts to [B, heads, S_q, S_k]; without a mask,
    ``causal`` selects causal or bidirectional attention.
    """

    def __init__(
        self, dim: int, n_heads: int, qk_bias: bool = False, bias: bool = False, rope_halves: bool = False
    ) -> None:
        super().__init__()
        self.rope_halves = rope_halves
        if dim % n_heads:
            raise ValueError(f"hidden size {dim} is not divisible by {n_heads} heads")
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.Wqkv = Linear(dim, 3 * dim, bias=bias)
        self.qk_bias = nn.Parameter(torch.zeros(2, 1, n_heads, self.head_dim)) if qk_bias else None
        self.proj = Linear(dim, dim, bias=bias)

    def project(
        self, x: torch.Tensor, rope: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys (biased, then rotated) and values of ``x`` [B, S, dim], each [B, S, heads, head_dim]."""
        batch, length, _ = x.shape
        qkv = self.Wqkv(x).view(batch, length, 3, self.n_heads, self.head_dim)
        # Queries and keys are biased and rotated together: [B, S, 2, heads, head_dim].
        qk = qkv[:, :, :2]
        if self.qk_bias is not None:
            qk = qk + self.qk_bias.view(2, self.n_heads, self.head_dim)
        if rope is not None:
            qk = apply_rope(qk, rope.unsqueeze(2), self.rope_halves)
        q, k = qk.unbind(2)
        return q, k, qkv[:, :, 2]

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = True,
        kv_hook: KVHook | None = None,
    ) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.project(x, rope))
        if kv_hook is not None:
            k, v = kv_hook(k, v)
        if mask is not None and length == 1 and torch.compiler.is_compiling():
            # One query (a decoding step): written out, the softmax fuses into the compiled graph, where the
            # SDPA kernel would be a separate call that costs more than its arithmetic.
            scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
            out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        elif mask is not None:
            out = attend(q, k, v, attn_mask=mask)
        elif causal and length > 1:
            if k.shape[2] != length:
                offset = k.shape[2] - length
                mask = torch.ones(length, k.shape[2], dtype=torch.bool, device=x.device).tril(offset)
                out = attend(q, k, v, attn_mask=mask)
            else:
                out = attend(q, k, v, is_causal=True)
        else:
            out = attend(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, length, dim))
