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
        if x.dtype == self.weight.dtype == torch.float32 and not torch.is_autocast_enabled(x.device.type):
            # Already fp32 everywhere: one fused call computes the same x * rsqrt(mean(x^2) + eps) * weight.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        with torch.autocast(device_type=x.device.type if x.device.type != "meta" else "cpu", enabled=False):
            normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return normed.type_as(x) * self.weight
