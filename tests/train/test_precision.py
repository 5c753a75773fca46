"""Training on a CPU: the same float rounding at any thread count, in the compiled kernels and in the matrix
products."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch._dynamo

from latentloop.errors import UsageError
from latentloop.train.precision import compile_for_training
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_REASONER


def column_sums(x: torch.Tensor) -> torch.Tensor:
    """A reduction over rows, the shape of a bias gradient over a batch: the kind a kernel splits by thread."""
    return (x * 1.0001 + 0.5).sum(0)


def sums_on_one_and_two_threads(kernel_threads: int) -> list[torch.Tensor]:
    compile_for_training(torch.nn.Linear(2, 2), "cpu", kernel_threads)
    x = torch.randn(8192, 64, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    sums = []
    try:
        for count in (1, 2):
            torch._dynamo.reset()
            torch.set_num_threads(count)
            sums.append(torch.compile(column_sums)(x))
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        compile_for_training(torch.nn.Linear(2, 2), "cpu")  # back to the default for the tests after
    return sums


def test_one_thread_per_compiled_kernel_rounds_the_same_at_any_thread_count():
    """train.compile_threads=1: each compiled kernel sums on one thread, so a run on one thread and a run on
    two give equal bits. By default a kernel splits the rows over two threads and rounds differently (by about
    1e-2 here), so the check can fail."""
    one, two = sums_on_one_and_two_threads(kernel_threads=1)
    assert torch.equal(one, two)
    one, two = sums_on_one_and_two_threads(kernel_threads=0)
    assert not torch.equal(one, two)


# A weight gradient of a narrow head: a 7 x 64 output summed over 1152 rows, which MKL splits across threads
PRODUCT_ON_ONE_AND_TWO_THREADS = """
import sys
if sys.argv[1] == "latentloop":
    import latentloop
import torch
a, b = torch.randn(7, 1152, generator=torch.Generator().manual_seed(0)), torch.randn(1152, 64)
products = []
for threads in (1, 2):
    torch.set_num_threads(threads)
    products.append(a @ b)
print(torch.equal(*products))
"""


def products_agree(import_first: str) -> bool:
    environment = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
    command = [sys.executable, "-c", PRODUCT_ON_ONE_AND_TWO_THREADS, import_first]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    return result.stdout.strip() == "True"


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: MKL does not split a product")
def test_importing_latentloop_makes_matrix_products_round_alike_on_any_thread_count():
    """latentloop sets MKL's strict reproducibility mode before torch's first product, so a product rounds
    alike on one and on two threads; torch alone splits this product by thread and rounds differently."""
    if products_agree("torch"):
        pytest.skip("this machine's MKL does not split the product by thread: nothing to tell apart")
    assert products_agree("latentloop")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "one"])
def test_compile_threads_must_be_a_whole_number(bad):
    data = {**TINY_REASONER, "train": {**TINY_REASONER["train"], "compile_threads": bad}}
    with pytest.raises(UsageError, match=r"train\.compile_threads"):
        build_reasoner_config(data, arch="trm")
