"""Process-wide settings that make CPU results reproducible from one process to the next, and a wall-clock timer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The CPU's vector extensions that decide the speed of fp32 and bf16 matmuls on the CPU.
_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_description() -> str | None:
    """The processor's name and its vector extensions among ``_VECTOR_FLAGS``, as Linux reports them (None
    elsewhere): ``AMD EPYC (avx2 avx512f avx512_bf16)``."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    if name is None:
        return None
    vector = " ".join(f for f in _VECTOR_FLAGS if f in flags)
    return f"{name} ({vector})" if vector else name


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


def median_seconds(work: Callable[[], object], repeats: int, warm_up: bool = False) -> float:
    """The median wall-clock seconds of ``repeats`` calls of ``work`` (after one untimed call if ``warm_up``)."""
    if warm_up:
        work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
