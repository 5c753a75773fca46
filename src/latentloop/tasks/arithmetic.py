"""Multi-digit arithmetic, written so that the carry chain must be resolved inside one forward pass.

A problem is ``a op b`` with both operands zero-padded to ``digits`` digits, and its answer is written
**most-significant digit first**, zero-padded to a fixed width::

    0347+0589=00936<eos>          (digits=4, op '+', answer width digits+1)
    0347-0589=-0242<eos>          ('-': a sign then digits, width digits+1)
    12*34=0408<eos>               ('*': width 2*digits)

Writing the answer MSD-first means the first answer token already depends on every carry below it: the model
cannot propagate carries one emitted token at a time (as it could LSD-first) and has to resolve the chain in its
latent iterations, which is where extra recurrence depth helps.

Held-out split: a problem is a *test* problem exactly when a stable hash (BLAKE2b) of its prompt text falls
into the lowest ``test_fraction`` of buckets. Training draws skip those, so train and test are disjoint by
construction, for every seed and however long training runs.

Token layout per example (byte-level ids, see :mod:`latentloop.data.tokenizers`): ``input_ids`` is
prompt + answer without the final token, ``labels`` is -100 over the prompt and the answer tokens plus
``<eos>`` aligned with the positions that predict them; every example is padded to :attr:`seq_len`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from latentloop.data.tokenizers import ByteTokenizer
from latentloop.errors import UsageError
from latentloop.tasks.base import Task

OPS = ("+", "-", "*")
_DATA_STREAM = 0xDA7A  # mixed into the seed so data draws never share a stream with depth draws
_BUCKETS = 1_000_000
_ENUMERATE_LIMIT = 200_000  # problem spaces up to this size are enumerated for the test set


@dataclass(frozen=True)
class Problem:
    """``a op b`` with non-negative operands."""

    a: int
    b: int
    op: str

    def value(self) -> int:
        """The exact result."""
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        if self.op == "*":
            return self.a * self.b
        raise ValueError(f"unknown operator {self.op!r}")


def _as_int(value: Any, name: str, low: int, high: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"arithmetic: {name} must be an integer, got {value!r}") from None
    if not number.is_integer() or not low <= number <= high:
        raise UsageError(f"arithmetic: {name} must be an integer in {low}..{high}, got {value!r}")
    return int(number)


class ArithmeticTask(Task):
    """Fixed-width arithmetic, answers MSD-first; see the module docstring.

    Options: ``digits`` (operand width, 1-18), ``ops`` (a string or list drawn from ``+ - *``; each problem
    picks one uniformly), ``test_fraction`` (share of the problem space reserved for testing), ``test_size``
    (how many held-out problems :meth:`examples` yields for ``"test"``).
    """

    name = "arithmetic"
    metric = "exact_match"
    trains_language_model = True

    def __init__(
        self,
        digits: int | str = 3,
        ops: str | list[str] = "+",
        test_fraction: float | str = 0.05,
        test_size: int | str = 1000,
    ) -> None:
        self.digits = _as_int(digits, "digits", 1, 18)
        if isinstance(ops, (list, tuple)):
            ops = "".join(str(o) for o in ops)
        ops_list = sorted(set(str(ops).replace(",", "").replace(" ", "")))
        bad = [o for o in ops_list if o not in OPS]
        if bad or not ops_list:
            raise UsageError(f"arithmetic: ops must be drawn from {' '.join(OPS)}, got {ops!r}")
        self.ops = tuple(o for o in OPS if o in ops_list)
        try:
            self.test_fraction = float(test_fraction)
        except (TypeError, ValueError):
            raise UsageError(f"arithmetic: test_fraction must be a number, got {test_fraction!r}") from None
        if not 0 < self.test_fraction <= 0.5:
            raise UsageError(f"arithmetic: test_fraction must be in (0, 0.5], got {test_fraction!r}")
        self.test_size = _as_int(test_size, "test_size", 1, 10_000_000)
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self._threshold = round(self.test_fraction * _BUCKETS)
        # Longest prompt + answer + <eos>, minus one (inputs drop the last token).
        self.seq_len = max(len(self.prompt(Problem(0, 0, op))) + self.answer_width(op) for op in self.ops)
        self._test: list[Problem] | None = None

    # Text forms -----------------------------------------------------------------------------------------------
    def answer_width(self, op: str) -> int:
        """Characters of the answer of ``op`` (sign included for ``-``)."""
        return 2 * self.digits if op == "*" else self.digits + 1

    def prompt(self, problem: Problem) -> str:
        """``"0347+0589="``."""
        return f"{problem.a:0{self.digits}d}{problem.op}{problem.b:0{self.digits}d}="

    def answer(self, problem: Problem) -> str:
        """The canonical fixed-width answer text (without the end marker), e.g. ``"00936"`` or ``"-0242"``."""
        width = self.answer_width(problem.op)
        if problem.op == "-":
            return f"{problem.value():+0{width}d}"
        return f"{problem.value():0{width}d}"

    def format(self, answer: Any, pretty: bool = False) -> str:
        """A problem's prompt, or an answer as text (one line either way)."""
        return self.prompt(answer) if isinstance(answer, Problem) else str(answer)

    def parse(self, text: str) -> Problem:
        """``"347+589"`` or ``"0347+0589="`` -> :class:`Problem`; clear errors on anything else."""
        match = re.fullmatch(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*=?\s*", text)
        if not match:
            raise UsageError(f"arithmetic: cannot parse {text!r} (expected e.g. 347+589)")
        a, op, b = match.groups()
        if op not in self.ops:
            raise UsageError(
                f"arithmetic: operator {op!r} is not among this task's ops {''.join(self.ops)!r}"
            )
        if max(len(a.lstrip("0")), len(b.lstrip("0"))) > self.digits:
            raise UsageError(f"arithmetic: operands of {text!r} have more than {self.digits} digits")
        return Problem(int(a), int(b), op)

    def encode(self, puzzle: Problem | str) -> list[int]:
        """Token ids of a problem's prompt (or of any text)."""
        return self.tokenizer.encode(self.prompt(puzzle) if isinstance(puzzle, Problem) else puzzle)

    def decode(self, tokens: Any) -> str:
        """Text of token ids, stopping at the first ``<eos>``."""
        ids = [int(t) for t in tokens]
        if self.tokenizer.eos_id in ids:
            ids = ids[: ids.index(self.tokenizer.eos_id)]
        return self.tokenizer.decode(ids)

    def verify(self, puzzle: Problem | str, answer: Any) -> bool:
        """True when ``answer`` (an int, or text such as ``"00936"``/``"-0242"``, end marker allowed) is the exact
        result of ``puzzle``."""
        problem = self.parse(puzzle) if isinstance(puzzle, str) else puzzle
        if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
            return int(answer) == problem.value()
        text = str(answer).replace("\n", "").strip()
        if not re.fullmatch(r"[-+]?\d+", text):
            return False
        return int(text) == problem.value()

    # Splits ---------------------------------------------------------------------------------------------------
    def is_test(self, problem: Problem) -> bool:
        """Whether ``problem`` belongs to the held-out split (a stable hash of its prompt text)."""
        digest = hashlib.blake2b(self.prompt(problem).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % _BUCKETS < self._threshold

    def _random_problem(self, rng: np.random.Generator) -> Problem:
        high = 10**self.digits
        op = self.ops[int(rng.integers(len(self.ops)))]
        return Problem(int(rng.integers(high)), int(rng.integers(high)), op)

    def sample_train(self, rng: np.random.Generator) -> Problem:
        """A uniformly random training problem (test problems are redrawn)."""
        while True:
            problem = self._random_problem(rng)
            if not self.is_test(problem):
                return problem

    def test_problems(self) -> list[Problem]:
        """The fixed held-out problems (at most ``test_size``), identical for every seed and run."""
        if self._test is None:
            high = 10**self.digits
            rng = np.random.default_rng([_DATA_STREAM, 0x7E57])
            if len(self.ops) * high * high <= _ENUMERATE_LIMIT:
                pool = [Problem(a, b, op) for op in self.ops for a in range(high) for b in range(high)]
                pool = [p for p in pool if self.is_test(p)]
                order = rng.permutation(len(pool))
                self._test = [pool[i] for i in order[: self.test_size]]
            else:
                seen: set[Problem] = set()
                tests: list[Problem] = []
                for _ in range(self.test_size * 200):
                    problem = self._random_problem(rng)
                    if problem not in seen and self.is_test(problem):
                        seen.add(problem)
                        tests.append(problem)
                        if len(tests) == self.test_size:
                            break
                self._test = tests
            if not self._test:
                raise UsageError("arithmetic: the held-out split is empty; raise digits or test_fraction")
        return self._test

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[Problem, str]]:
        """``(problem, answer text)``: endless fresh draws for ``"train"``, the fixed list for ``"test"``."""
        if split == "test":
            for problem in self.test_problems():
                yield problem, self.answer(problem)
        elif split == "train":
            rng = np.random.default_rng([_DATA_STREAM, int(seed) & 0xFFFFFFFF])
            while True:
                problem = self.sample_train(rng)
                yield problem, self.answer(problem)
        else:
            raise UsageError(f"arithmetic: unknown split {split!r} (train or test)")

    # Tensors --------------------------------------------------------------------------------------------------
    def encode_example(self, problem: Problem) -> tuple[list[int], list[int]]:
        """``(input_ids, labels)`` of one example, padded to :attr:`seq_len`."""
        prompt = self.encode(problem)
        answer = [*self.tokenizer.encode(self.answer(problem)), self.tokenizer.eos_id]
        full = prompt + answer
        inputs = full[:-1]
        labels = [-100] * (len(prompt) - 1) + answer
        pad = self.seq_len - len(inputs)
        return inputs + [self.tokenizer.pad_id] * pad, labels + [-100] * pad

    def collate(self, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` int64 tensors [B, seq_len] for ``problems``."""
        pairs = [self.encode_example(p) for p in problems]
        return (
            torch.tensor([p[0] for p in pairs], dtype=torch.long),
            torch.tensor([p[1] for p in pairs], dtype=torch.long),
        )

    def train_batch(self, step: int, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The training batch of ``step``: a pure function of ``(seed, step)``, so resuming needs no data state."""
        rng = np.random.default_rng([_DATA_STREAM, int(seed) & 0xFFFFFFFF, int(step)])
        return self.collate([self.sample_train(rng) for _ in range(batch_size)])

    def heldout_batches(
        self, batch_size: int, limit: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[Problem]]]:
        """The held-out problems as ``(input_ids, labels, problems)`` batches (the first ``limit`` problems)."""
        problems = self.test_problems()[:limit] if limit else self.test_problems()
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            yield (*self.collate(chunk), chunk)
