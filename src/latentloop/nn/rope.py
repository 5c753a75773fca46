"""Rotary position embedding over *adjacent* pairs of dimensions (the complex-number convention).

Each pair ``(x[2i], x[2i+1])`` is read as the complex number ``x[2i] + j x[2i+1]`` and multiplied by
``exp(j * position * base ** (-2i / head_dim))``; the rotation runs in fp32.
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
    """Holds the unit complex rotations ``[max_positions, head_dim // 2]`` and looks them up by position."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10_000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.max_positions = max_positions
        angles = rope_frequencies(head_dim, max_positions, base)
        self.register_buffer("rotations", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def tables(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotations for ``positions`` ([S] or [B, S]) shaped ``[1 or B, S, 1, head_dim // 2]``, which broadcast
        over ``[B, S, heads, head_dim // 2]``."""
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} exceeds block_size {self.max_positions}")
        rotations = self.rotations[positions]
        return rotations[None, :, None] if positions.dim() == 1 else rotations[:, :, None]


def apply_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` ([B, S, ..., head_dim]) by complex ``rotations`` that broadcast over
    ``[B, S, ..., head_dim // 2]``; computed in fp32 and cast back to ``x``'s dtype."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotations).flatten(-2).type_as(x)
