"""RMSNorm, computed in fp32 and cast back before the weight is applied."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` with the normalisation in fp32 (``norm_eps`` inside the root)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type if x.device.type != "meta" else "cpu", enabled=False):
            normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return normed.type_as(x) * self.weight
