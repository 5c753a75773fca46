import json
import subprocess
import sys

import pytest

# In a fresh process: the torch calls that settle_vector_math makes (with the sizes of their tensor
# arguments), then the first vector-math call on a tensor split across threads, and the same call again.
FIRST_CALLS = """
import json
import torch
from torch.overrides import TorchFunctionMode
from latentloop.runtime import settle_vector_math

calls = []

class Record(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        sizes = [a.numel() for a in args if isinstance(a, torch.Tensor)]
        calls.append([getattr(func, "__name__", str(func)).rstrip("_"), sizes])
        return func(*args, **(kwargs or {}))

with Record():
    settle_vector_math()
x = torch.linspace(0.5, 1.5, 3072)
same = all(torch.equal(f(x), f(x)) for f in (torch.sqrt, torch.exp, torch.log, torch.tanh))
print(json.dumps({"settling_calls": calls, "same": same}))
"""
VECTOR_MATH = {"sqrt", "rsqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "tanh", "sin", "cos", "erf"}
# PyTorch hands a vector-math call to its threads in chunks of at least this many elements.
VECTOR_MATH_CHUNK = 2048


@pytest.mark.parametrize("trial", range(4))
def test_settled_vector_math_gives_the_same_answer_from_the_first_call(trial):
    result = subprocess.run([sys.executable, "-c", FIRST_CALLS], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    # What settling is: the process's first vector-math call runs on a tensor too small to be split, so no
    # two threads can race for its first call (the race itself shows only on some machines).
    vector_calls = [sizes for name, sizes in report["settling_calls"] if name in VECTOR_MATH]
    assert vector_calls, report["settling_calls"]
    assert vector_calls[0] and max(vector_calls[0]) < VECTOR_MATH_CHUNK, vector_calls
    assert report["same"]


def test_cpu_description_names_the_processor_and_its_matmul_extensions(monkeypatch):
    from pathlib import Path

    from latentloop import runtime

    cpuinfo = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 fma\n"
    )
    real = Path.read_text
    monkeypatch.setattr(
        Path,
        "read_text",
        lambda self, *a, **k: cpuinfo if str(self) == "/proc/cpuinfo" else real(self, *a, **k),
    )
    assert runtime.cpu_description() == "AMD EPYC 9R14 (avx2 avx512f avx512_bf16)"
    cpuinfo = "model name\t: Some CPU\nflags\t\t: fpu sse2\n"
    assert runtime.cpu_description() == "Some CPU"
