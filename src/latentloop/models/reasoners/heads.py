"""Output heads shared by every reasoner: the halting Q-head and the value head (latent process reward model)."""

from __future__ import annotations

import torch
from torch import nn


class HaltHead(nn.Module):
    """``q_halt`` from the state of the first position (HRM/TRM/GRAM's Q-head): one logit per sample.

    Starts strongly negative (bias -5, zero weights, as in HRM) so that early in training nothing halts.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.constant_(self.proj.bias, -5.0)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.proj(state[:, 0].float()).squeeze(-1)


class ValueHead(nn.Module):
    """``v(z) in (0, 1)``: the predicted accuracy of the answer the latent ``z`` decodes to (GRAM's LPRM).

    Reads the mean state over positions: the answer's quality is a property of the whole grid.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.proj(state.float().mean(dim=1)).squeeze(-1))
