"""Compiled training on a CPU: the same float rounding at any thread count."""

from __future__ import annotations

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


@pytest.mark.parametrize("bad", [-1, 1.5, True, "one"])
def test_compile_threads_must_be_a_whole_number(bad):
    data = {**TINY_REASONER, "train": {**TINY_REASONER["train"], "compile_threads": bad}}
    with pytest.raises(UsageError, match=r"train\.compile_threads"):
        build_reasoner_config(data, arch="trm")
