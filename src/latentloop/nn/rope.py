"""Rotary position embedding over *adjacent* pairs of dimensions (the complex-number convention).

Each pair ``(x[2i], x[2i+1])`` is read as the complex number ``x[2i] + j x[2i+1]`` and multiplied by
``exp(j * position * base ** (-2i / head_dim))``; the rotation runs in fp32. The product is written out in
real arithmetic on ``(cos, sin)`` tables, which gives the same bits as complex multiplication and, unlike
complex tensors, compiles with ``torch.compile``.
"""

from __future__ import annotations

import torch
from torch import nn


def rope_frequencies(head_dim: int, max_positions: int, base: float = 10_000.0) -> torch.Tensor:
    """Angles ``[max_positions, head_dim // 2]``: position times ``base ** (-2i / head_dim)``."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    positions = torch.arange(max_positions, dtype=torch.float32)
    return torch.outer(positions, inv_freq)


def huginn_freqs_cis(head_dim: int, max_positions: int, base: float) -> torch.Tensor:
    """The ``freqs_cis`` buffer of the huginn-0125 layout: ``[1, T, 1, head_dim // 2, 2]`` of (cos, sin)."""
    angles = rope_frequencies(head_dim, max_positions, base)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)[None, :, None]


class RotaryEmbedding(nn.Module):
    """Holds the rotations ``[max_positions, head_dim // 2, 2]`` as ``(cos, sin)`` pairs and looks them up by
    position."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10_000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.max_positions = max_positions
        self.register_buffer("rotations", self.cos_sin(), persistent=False)

    def angles(self) -> torch.Tensor:
        """The rotation angles ``[max_positions, head_dim // 2]`` of every position."""
        return rope_frequencies(self.head_dim, self.max_positions, self.base)

    def cos_sin(self) -> torch.Tensor:
        """``(cos, sin)`` of every angle, ``[max_positions, head_dim // 2, 2]`` in fp32."""
        angles = self.angles()
        return torch.stack([angles.cos(), angles.sin()], -1)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        # Casting a model to bf16 must not round its rotations: the rotation runs in fp32 whatever the weights.
        if self.rotations.dtype != torch.float32:
            self.rotations = self.cos_sin().to(self.rotations.device)
        return self

    def tables(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotations for ``positions`` ([S] or [B, S]) shaped ``[1 or B, S, 1, head_dim // 2, 2]``, which
        broadcast over the pairs ``[B, S, heads, head_dim // 2, 2]``."""
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} exceeds block_size {self.max_positions}")
        rotations = self.rotations[positions]
        return rotations[None, :, None] if positions.dim() == 1 else rotations[:, :, None]


class AxialRotaryEmbedding(RotaryEmbedding):
    """Rotary embedding of a grid read row by row (axial 2-D RoPE, Heo et al. 2024, "Rotary Position Embedding
    for Vision Transformer"): position ``p`` is the cell ``(p // width, p % width)``, the first half of the
    pairs rotates by the row and the second half by the column, each with the frequencies of a
    ``head_dim // 2`` rotary embedding. A query-key score then depends on the offset in rows and in columns
    separately, where 1-D RoPE sees only ``width * rows + columns``.
    """

    def __init__(self, head_dim: int, max_positions: int, width: int, base: float = 10_000.0) -> None:
        if head_dim % 4 or width < 1 or max_positions % width:
            raise ValueError(
                f"axial RoPE needs head_dim % 4 == 0 and {max_positions} positions in rows of {width}"
            )
        self.width = width
        super().__init__(head_dim, max_positions, base)

    def angles(self) -> torch.Tensor:
        positions = torch.arange(self.max_positions)
        rows, cols = positions // self.width, positions % self.width
        axis = rope_frequencies(
            self.head_dim // 2, max(self.max_positions // self.width, self.width), self.base
        )
        return torch.cat([axis[rows], axis[cols]], dim=-1)


def apply_rope(x: torch.Tensor, rotations: torch.Tensor, halves: bool = False) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` ([B, S, ..., head_dim]) by ``rotations`` (``(cos, sin)`` pairs from
    :meth:`RotaryEmbedding.tables`, broadcasting over ``[B, S, ..., head_dim // 2, 2]``); computed in fp32 and
    cast back to ``x``'s dtype. ``halves`` pairs dimension ``i`` with ``i + head_dim / 2`` instead (the
    "rotate half" layout of the Llama, HRM and TRM code), with the same frequencies.

    Written as ``x * cos + partner * sin``, with each pair's partner ``(-b, a)`` and the angles repeated to
    the head's width: full-width products that vectorise, where products on the strided halves of each pair
    ran two to three times slower; ``a * cos + (-b) * sin`` rounds exactly as ``a * cos - b * sin``.
    """
    cos, sin = rotations.unbind(-1)
    x32 = x.float()
    if halves:
        first, second = x32.chunk(2, dim=-1)
        partner = torch.cat([-second, first], -1)
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    else:
        first, second = x32.unflatten(-1, (-1, 2)).unbind(-1)
        partner = torch.stack([-second, first], -1).flatten(-2)
        cos, sin = torch.stack([cos, cos], -1).flatten(-2), torch.stack([sin, sin], -1).flatten(-2)
    return (x32 * cos + partner * sin).type_as(x)
