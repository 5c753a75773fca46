"""RMSNorm, computed in fp32 and cast back before the weight is applied."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` with the normalisation in fp32 (``norm_eps`` inside the root).

    ``weight=False`` leaves out the learned scale (HRM's and TRM's weight-free norm): ``x / rms(x)``.
    """

    def __init__(self, dim: int, eps: float = 1e-6, weight: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            # Written out as the official HRM/TRM norm is: elementwise, the result keeps the strides of ``x``
            # (a transposed sequence-mixer input stays transposed), so later matmuls round the same way.
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)).type_as(x)
        if x.dtype == self.weight.dtype == torch.float32 and not torch.is_autocast_enabled(x.device.type):
            # Already fp32 everywhere: one fused call computes the same x * rsqrt(mean(x^2) + eps) * weight.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        with torch.autocast(device_type=x.device.type if x.device.type != "meta" else "cpu", enabled=False):
            normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return normed.type_as(x) * self.weight
