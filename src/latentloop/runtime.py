"""Process-wide settings that make CPU results reproducible from one process to the next."""

from __future__ import annotations

import torch

_settled = False


def settle_vector_math() -> None:
    """Make the first call of the vector math library (``sqrt``, ``exp``, ``log``, ``tanh``, ...) in this
    process single-threaded.

    On CPU these functions go to MKL's vector math in parallel chunks, and when two threads make its very
    first call at once, one of them can take a less exact code path (on the machines measured, about one
    process in five). Which one wins differs between processes, so two runs with the same seed, or a run and
    its resumption, would differ in the last bits from that call on; Adam amplifies this past any tolerance.
    A first call on a tensor too small to be split settles the library for the rest of the process.
    """
    global _settled
    if not _settled:
        torch.sqrt(torch.ones(8))
        _settled = True
