"""Multi-digit arithmetic, written so that the carry chain must be resolved inside one forward pass.

A problem is ``a op b`` with both operands zero-padded to ``digits`` digits, and its answer is written
**most-significant digit first**, zero-padded to a fixed width::

    0347+0589=00936<eos>          (digits=4, op '+', answer width digits+1)
    0347-0589=-0242<eos>          ('-': a sign then digits, width digits+1)
    12*34=0408<eos>               ('*': width 2*digits)

Writing the answer MSD-first means the first answer token already depends on every carry below it: the model
cannot propagate carries one emitted token at a time (as it could LSD-first) and has to resolve the chain in its
latent iterations, which is where extra recurrence depth helps.

Splits, token layout and batches are those of :class:`~latentloop.tasks.problems.GeneratedProblemTask`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from latentloop.errors import UsageError
from latentloop.tasks.problems import DATA_STREAM, GeneratedProblemTask, integer_option

OPS = ("+", "-", "*")
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


class ArithmeticTask(GeneratedProblemTask):
    """Fixed-width arithmetic, answers MSD-first; see the module docstring.

    Options: ``digits`` (operand width, 1-18), ``ops`` (a string or list drawn from ``+ - *``; each problem
    picks one uniformly), ``test_fraction`` (share of the problem space reserved for testing), ``test_size``
    (how many held-out problems :meth:`examples` yields for ``"test"``).
    """

    name = "arithmetic"

    def __init__(
        self,
        digits: int | str = 3,
        ops: str | list[str] = "+",
        test_fraction: float | str = 0.05,
        test_size: int | str = 1000,
    ) -> None:
        self.digits = integer_option(self.name, digits, "digits", 1, 18)
        if isinstance(ops, (list, tuple)):
            ops = "".join(str(o) for o in ops)
        ops_list = sorted(set(str(ops).replace(",", "").replace(" ", "")))
        bad = [o for o in ops_list if o not in OPS]
        if bad or not ops_list:
            raise UsageError(f"arithmetic: ops must be drawn from {' '.join(OPS)}, got {ops!r}")
        self.ops = tuple(o for o in OPS if o in ops_list)
        super().__init__(test_fraction, test_size)
        # Longest prompt + answer + <eos>, minus one (inputs drop the last token).
        self.seq_len = max(len(self.prompt(Problem(0, 0, op))) + self.answer_width(op) for op in self.ops)

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
    def random_problem(
        self, rng: np.random.Generator, split: str = "train", step: int | None = None
    ) -> Problem:
        """A uniformly random problem (both splits and every step draw alike)."""
        high = 10**self.digits
        op = self.ops[int(rng.integers(len(self.ops)))]
        return Problem(int(rng.integers(high)), int(rng.integers(high)), op)

    def test_problems(self) -> list[Problem]:
        """The fixed held-out problems (at most ``test_size``), identical for every seed and run; a problem
        space small enough is enumerated, so the test set is every held-out problem when it is small."""
        high = 10**self.digits
        if self._test is None and len(self.ops) * high * high <= _ENUMERATE_LIMIT:
            pool = [Problem(a, b, op) for op in self.ops for a in range(high) for b in range(high)]
            pool = [p for p in pool if self.is_test(p)]
            if not pool:
                raise UsageError("arithmetic: the held-out split is empty; raise digits or test_fraction")
            order = np.random.default_rng([DATA_STREAM, 0x7E57]).permutation(len(pool))
            self._test = [pool[i] for i in order[: self.test_size]]
        return super().test_problems()
