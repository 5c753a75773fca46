"""Gated SiLU MLP with one fused input projection (gate half first)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.nn.linear import Linear


class GatedMLP(nn.Module):
    """``proj(silu(gate) * up)`` where ``[gate, up] = fc(x)``."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.fc = Linear(dim, 2 * hidden, bias=bias)
        self.proj = Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)
