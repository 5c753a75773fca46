import subprocess
import sys

import pytest

# In a fresh process, the first vector-math call on a tensor split across threads, then the same call again.
FIRST_CALLS = """
import torch
from latentloop.runtime import settle_vector_math
settle_vector_math()
x = torch.linspace(0.5, 1.5, 3072)
print(all(torch.equal(f(x), f(x)) for f in (torch.sqrt, torch.exp, torch.log, torch.tanh)))
"""


@pytest.mark.parametrize("trial", range(4))
def test_settled_vector_math_gives_the_same_answer_from_the_first_call(trial):
    result = subprocess.run([sys.executable, "-c", FIRST_CALLS], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True"
