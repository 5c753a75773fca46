"""Linear layers with their weights repacked once for oneDNN's CPU matrix kernels, for decoding.

Decoding a batch of B prompts multiplies B rows by every weight of the model, once per step. At a few rows,
``F.linear`` (a plain GEMM on the row-major weight) uses the CPU poorly; oneDNN's kernels on a weight reordered
once into their blocked layout do better. :func:`prepacked` builds a copy of a model that shares every parameter
and runs each ``nn.Linear`` through those kernels. It costs a second copy of every linear weight for as long
as the copy lives, and the sums run in another order, so the outputs differ from ``F.linear``'s in the last bits.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

from latentloop.errors import UsageError


class PackedLinear(nn.Module):
    """``F.linear(x, W, b)`` through oneDNN, on ``W`` reordered once for ``rows`` rows per call (a hint for the
    layout; any number of rows works). Inference only: the packed weight is a detached copy."""

    def __init__(self, linear: nn.Linear, rows: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, max(int(rows), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.detach()
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def can_prepack(module: nn.Module) -> str | None:
    """None if :func:`prepacked` can pack ``module``'s linear layers, else why not (one line)."""
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    for linear in (m for m in module.modules() if isinstance(m, nn.Linear)):
        weight = linear.weight
        if weight.device.type != "cpu":
            return f"packed weights are for CPU models; this one is on {weight.device.type}"
        if weight.dtype not in (torch.float32, torch.bfloat16):
            return f"packed weights take fp32 or bf16, not {weight.dtype}"
        if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return "this CPU has no oneDNN bf16 kernels (AVX-512 or AVX-NE-CONVERT); use fp32"
    return None


def prepacked(module: nn.Module, rows: int) -> nn.Module:
    """A copy of ``module`` that shares its parameters and buffers, with every ``nn.Linear`` replaced by a
    :class:`PackedLinear` for calls of about ``rows`` rows. Raises :class:`~latentloop.errors.UsageError`
    where :func:`can_prepack` says no."""
    reason = can_prepack(module)
    if reason is not None:
        raise UsageError(f"prepack: {reason}")
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    clone = copy.deepcopy(module, memo=shared)
    packs: dict[tuple[int, int], PackedLinear] = {}  # a layer used twice is packed once
    for parent in list(clone.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                key = (id(child.weight), id(child.bias))
                if key not in packs:
                    packs[key] = PackedLinear(child, rows)
                setattr(parent, name, packs[key])
    return clone
