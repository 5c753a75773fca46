"""Greedy tokens from a large output layer, reading it at half the bytes.

At a few rows, choosing the next token is bound by reading the output layer ``W`` [V, h]: for a vocabulary of
49,152 and h = 512 that is 100 MB in fp32 per token. Greedy decoding needs only the largest logit.
:class:`ScreenedArgmax` reads an fp16 copy of ``W``, bounds how far each approximate logit can be from the fp32
product, and computes in fp32 only the logits whose interval reaches the largest lower bound. Every other logit
is provably below one of those, so the argmax is the fp32 product's.

The bound, for a row ``w`` of ``W`` and an input ``x``, with ``w'`` and ``x'`` their fp16 roundings::

    w·x - w'·x' = (w - w')·x + w'·(x - x')    so    |w·x - w'·x'| <= |w - w'| |x| + |w'| |x - x'|

by Cauchy-Schwarz. The fp16 product's own sums (fp32 accumulation, an fp16 result) add at most
``n u32 |w'| |x'| + u16 |result|``, and the fp32 product that greedy decoding would take carries ``n u32 |w| |x|``
of its own. Both constants are doubled for margin. :func:`can_screen` checks on random inputs that this
PyTorch's fp16 product stays well inside the bound (it would not if it summed in fp16).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from latentloop.errors import UsageError
from latentloop.runtime import median_seconds

UNIT_ROUNDOFF_FP32 = 2.0**-24
UNIT_ROUNDOFF_FP16 = 2.0**-11
FP16_MAX = 65504.0


class ScreenedArgmax:
    """The fp32 logits of ``W x`` that can be the largest, and -inf for every other, from one fp16 product.

    ``weight`` [V, h] (fp32) is read, not copied; an fp16 copy and two norms per row are kept. Build it with
    :func:`screened_argmax`, which checks :func:`can_screen` and reuses the screen while the weight is unchanged.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        weight = weight.detach()
        self.weight = weight
        self.half = weight.half()
        exact, rounded = weight.double(), self.half.double()
        self.rounding = (exact - rounded).norm(dim=1).float()  # |w - w'| per row
        self.norm = torch.maximum(exact.norm(dim=1), rounded.norm(dim=1)).float()  # bounds |w| and |w'|
        self.sum_error = 2 * 2 * weight.shape[1] * UNIT_ROUNDOFF_FP32  # two products' sums, doubled
        # (rows, the head's type) -> whether screening beats that head on this machine
        self.faster: dict[tuple[int, type], bool] = {}

    def bounds(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp16 product's logits [N, V] for ``rows`` [N, h] (fp32) and each one's distance bound from the fp32
        product."""
        rows_half = rows.half()
        approx = F.linear(rows_half, self.half).float()
        size = torch.maximum(rows.norm(dim=-1), rows_half.float().norm(dim=-1))[:, None]
        rounding = (rows - rows_half.float()).norm(dim=-1)[:, None]
        radius = self.rounding * size + self.norm * rounding + self.sums(approx, size)
        return approx, radius

    def sums(self, approx: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """What the products' own arithmetic may add to ``approx`` [N, V], for inputs of norm ``size`` [N, 1]:
        the sums of both products and the fp16 product's rounded result."""
        return self.norm * self.sum_error * size + 2 * UNIT_ROUNDOFF_FP16 * approx.abs()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., h] -> [..., V] fp32: the exact logits of every token that can be the argmax, -inf elsewhere.
        ``argmax`` of the result is the argmax of ``F.linear(x, W)``."""
        vocab, width = self.weight.shape
        rows = x.reshape(-1, width).float()
        approx, radius = self.bounds(rows)
        floor = (approx - radius).amax(-1, keepdim=True)
        candidates = approx + radius >= floor
        # An input or a product beyond fp16's range leaves the row's floor inf or nan (a product at -inf alone
        # leaves it finite and drops out as a nan bound): that row takes the full fp32 product.
        overflow = ~torch.isfinite(floor[:, 0])
        candidates[overflow] = False
        row, token = candidates.nonzero(as_tuple=True)
        logits = torch.full_like(approx, float("-inf"))
        logits[row, token] = (self.weight[token] * rows[row]).sum(-1)
        if bool(overflow.any()):
            logits[overflow] = F.linear(rows[overflow], self.weight)
        return logits.view(*x.shape[:-1], vocab)

    def pays_off(self, rows: int, head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> bool:
        """Whether screening ``rows`` rows runs faster on this machine than ``head`` (the output layer as the
        decoder runs it, e.g. a packed copy; default ``F.linear`` on the weight), timed once per row count and
        kind of head (medians of 5). Either way gives the same argmax; fp16 kernels differ by CPU, and on one with
        AVX2 only the fp16 product is 3x faster than fp32 at one row and slower at eight."""
        key = (rows, type(head))
        if key not in self.faster:
            # A generator of its own: the global one draws the decoder's initial states.
            x = torch.randn(rows, self.weight.shape[1], generator=torch.Generator().manual_seed(0))
            if head is None:
                head = functools.partial(F.linear, weight=self.weight)
            full = median_seconds(lambda: head(x), 5, warm_up=True)
            self.faster[key] = median_seconds(lambda: self.logits(x), 5, warm_up=True) < full
        return self.faster[key]


def can_screen(weight: torch.Tensor) -> str | None:
    """None if :class:`ScreenedArgmax` can screen ``weight``, else why not (one line)."""
    weight = weight.detach()
    if weight.dim() != 2:
        return f"the output layer must be a matrix, got shape {tuple(weight.shape)}"
    if weight.dtype != torch.float32:
        return f"screening reads an fp16 copy of an fp32 output layer; this one is {weight.dtype}"
    if weight.device.type != "cpu":
        return f"screening is for CPU decoding; the output layer is on {weight.device.type}"
    if not bool(torch.isfinite(weight).all()) or float(weight.abs().max()) > FP16_MAX:
        return "the output layer has weights beyond fp16's range"
    if not _sums_stay_bounded(weight.shape[1]):
        return "this PyTorch's fp16 product strays from fp32 beyond the screening bound"
    return None


def _sums_stay_bounded(width: int) -> bool:
    """Whether the fp16 product of random fp16 rows stays within :meth:`ScreenedArgmax.sums` of the exact one,
    at one row and at several. A kernel that summed in fp16 would stray by far more (about 6x at a width of 512,
    2.6x at 2048); one that sums in fp32 stays under half of it."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(256, width, generator=generator).half().float()
    screen = ScreenedArgmax(weight)
    for count in (1, 5):
        rows = (torch.randn(count, width, generator=generator) * 4).half().float()
        approx, _ = screen.bounds(rows)
        exact = (rows.double() @ weight.double().T).float()
        if not bool(((approx - exact).abs() <= screen.sums(approx, rows.norm(dim=-1)[:, None])).all()):
            return False
    return True


# By the weight's identity (a tensor's == is elementwise); an entry goes when its weight does.
_SCREENS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def screened_argmax(weight: torch.Tensor) -> ScreenedArgmax:
    """The screen of ``weight``, built once and reused while the weight is unchanged (an in-place update builds
    a new one). Raises :class:`~latentloop.errors.UsageError` where :func:`can_screen` says no."""
    kept = _SCREENS.get(weight)
    if kept is not None and kept[0] == weight._version:
        return kept[1]
    reason = can_screen(weight)
    if reason is not None:
        raise UsageError(f"screen_head: {reason}")
    screen = ScreenedArgmax(weight)
    _SCREENS[weight] = (weight._version, screen)
    return screen
