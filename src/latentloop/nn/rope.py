"""Rotary position embedding over *adjacent* pairs of dimensions (the complex-number convention)."""

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
    """Holds cos/sin tables and rotates queries and keys at given positions."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10_000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.max_positions = max_positions
        angles = rope_frequencies(head_dim, max_positions, base)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for ``positions`` ([S] or [B, S]), shaped to broadcast over [B, S, heads, head_dim/2]."""
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} exceeds block_size {self.max_positions}")
        cos, sin = self.cos[positions], self.sin[positions]
        if positions.dim() == 1:
            return cos[None, :, None, :], sin[None, :, None, :]
        return cos[:, :, None, :], sin[:, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs ``(x[2i], x[2i+1])`` of ``x`` [B, S, heads, head_dim] by the given angles (in fp32)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((real * cos - imag * sin, imag * cos + real * sin), dim=-1)
    return rotated.flatten(-2).type_as(x)
