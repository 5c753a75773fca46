"""A linear layer whose compiled graphs multiply a single row as row dot products.

Decoding one token multiplies a single row by every weight of the model. On a CPU, ``F.linear`` does that
through the BLAS matrix-vector kernel, which reads the weight at a fraction of the memory bandwidth and on one
thread (11 GB/s on a 2-core AMD EPYC whose memory delivers 26). Written as ``(x[..., None, :] * W).sum(-1)``,
the same product is a reduction that ``torch.compile`` fuses into one loop over the weight's rows, split
across the threads. In compiled greedy decoding at batch 1 on that CPU this gives 1.41x / 1.66x the tokens/s
of the same graphs on ``F.linear`` for Ouro (hidden 512, 4 / 8 steps) and 1.32x / 1.25x for a small Huginn
model (8 / 32 steps), with the same tokens (``latentloop bench row_dot_decoding``). From two rows on, the
reduction reads each weight once per row and loses (0.90x at 2 rows, 0.62-0.68x at 4), so only single rows
take it. Outside a compiled graph the product would materialise ``out x in`` numbers, so eager code always
takes ``F.linear``; so do GPUs, where it was not measured. The sums run in another order than the BLAS
kernel's, so outputs differ from ``F.linear``'s in the last bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROW_DOT_MAX_ROWS = 1
"""The most rows a compiled graph multiplies as row dot products."""


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; inside a compiled graph on a CPU, with at most :data:`ROW_DOT_MAX_ROWS`
    rows, as row dot products that the compiler fuses into one threaded pass over ``weight``."""
    few_rows = x.numel() <= ROW_DOT_MAX_ROWS * x.shape[-1]
    if torch.compiler.is_compiling() and few_rows and x.device.type == "cpu":
        out = (x.unsqueeze(-2) * weight).sum(-1)
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (the same parameters, state dict and initialisation) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
