"""Where and in what precision a run computes: the device, fp32 or bf16 (measured when ``auto``), compiled
blocks, and the seeding of every random number generator at the start of a run."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from latentloop.errors import UsageError
from latentloop.nn import compile_blocks


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (a run's weights are drawn after this)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _time_matmul(x: torch.Tensor, w: torch.Tensor, bf16: bool, repeats: int) -> float:
    device = x.device.type
    best = math.inf
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        for i in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            _ = x @ w
            if device == "cuda":
                torch.cuda.synchronize()
            if i:  # the first call warms up kernels and caches
                best = min(best, time.perf_counter() - start)
    return best


def measure_matmul_speed(
    rows: int, dim: int, hidden: int, device: str = "cpu", repeats: int = 5
) -> dict[str, float]:
    """Seconds for a ``[rows, dim] @ [dim, hidden]`` matmul in fp32 and under bf16 autocast (best of
    ``repeats``); inputs come from a private generator so the global torch RNG is untouched."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=generator).to(device)
    w = torch.randn(dim, hidden, generator=generator).to(device)
    return {
        "fp32": _time_matmul(x, w, False, repeats),
        "bf16": _time_matmul(x, w, True, repeats),
    }


def choose_precision(requested: str, width: int, hidden: int, tokens: int, device: str) -> str:
    """``fp32`` or ``bf16``. ``auto`` measures a matmul the size of the model's MLP (``width`` to ``2 *
    hidden``) at a batch of ``tokens``: bf16 is picked only when it is clearly (>10%) faster, since CPUs
    without native bf16 units run it several times slower than fp32."""
    if requested != "auto":
        return requested
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    timing = measure_matmul_speed(min(tokens, 4096), width, 2 * hidden, device)
    return "bf16" if timing["bf16"] < 0.9 * timing["fp32"] else "fp32"


def resumed_precision(requested: str, saved_state: Mapping[str, Any] | None) -> str:
    """``requested``, except that ``auto`` resumes with the precision the run's checkpoint was trained in
    (timing again could switch precision mid-run)."""
    saved = saved_state.get("precision") if saved_state is not None else None
    return saved if requested == "auto" and saved in ("fp32", "bf16") else requested


def resolve_device(requested: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"train.device is {requested!r}, but no CUDA device is available")
    return requested


def compile_for_training(model: torch.nn.Module, device: str, kernel_threads: int = 0) -> None:
    """``train.compile``: compile the model's blocks in place (:func:`latentloop.nn.compile_blocks`). On a
    CPU the compiler builds C++ kernels, so a missing C++ compiler is reported here, before training starts,
    rather than as a traceback at the first step.

    ``kernel_threads`` (``train.compile_threads``): the threads of each C++ kernel, 0 for every thread torch
    uses. On several, a kernel splits a reduction across them (the sum over a batch's rows that a bias
    gradient is), so its rounding, and from there a whole run, depends on the thread count. On one, the
    compiled kernels round the same at any ``torch.get_num_threads()``, as in a one-thread run, and the matrix
    products still use every thread (rounding alike on any count in MKL's strict mode, which importing
    latentloop sets)."""
    if not device.startswith("cuda"):
        try:
            from torch._inductor import config, cpp_builder  # loads the compiler stack: only here

            cpp_builder.get_cpp_compiler()
        except Exception as error:
            raise UsageError(
                "train.compile on a CPU needs a C++ compiler (g++ or clang++, or one named by $CXX); none was "
                "found: install one or drop train.compile"
            ) from error
        config.cpp.threads = kernel_threads or -1  # the compiler's setting is process-wide: set it each time
    compile_blocks(model)
