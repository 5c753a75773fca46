"""Variable chains: follow a chain of assignments back to its root, adding as you go, so that the depth a
problem needs grows with its number of hops.

A problem assigns ``variables`` letters, one statement each, in shuffled order, and asks for one of them.
Every statement is three characters, source first and the assigned letter last, so a prompt of ``variables``
statements always has the same length and the letter's position (which a causal model reads last) already
sees what it is assigned::

    =5dc4a=8bb3cd9e?a=    ->  5     read: d=5, a=c+4, b=8, c=b+3, e=d+9; a = ?
                                    (a = c+4 = (b+3)+4 = 8+3+4 = 15, mod 10)

A root statement gives a digit (``=8b``: b = 8); every other statement adds a digit 1-9 to another variable
(``b3c``: c = b + 3); values are taken mod 10. The asked variable ends a chain of ``hops`` statements (here
``b -> c -> a``, 3 hops); the other letters form distractor chains with roots of their own. Every hop changes
the value and the answer is one digit, so guessing gets 10% whatever the chain, and no shortcut skips a hop:
the model must find the asked variable's statement, then its parent's, and so on to the root. A causal
transformer resolves about one such lookup per layer, so a recurrent-depth model needs more iterations of its
core for more hops, the behaviour this task is built to measure (pointer chasing; Saunshi et al. 2025 and
Fan et al. 2024 study looped transformers on such tasks).

Difficulty is the knob ``hops``: training draws the chain length uniformly from its range (with
``hops_warmup=N``, from a range whose top grows linearly from the lowest length to the highest over the first
N training steps, and with ``warmup_variables=V`` the statements grow from V to ``variables`` alike: a
curriculum, a pure function of the step), and ``test_hops`` sets the held-out range, which may lie beyond
every length trained (extrapolation). Held-out problems always have ``variables`` statements, so a harder
tier is exactly as long as an easy one and no position is new to the model. Splits, token layout and batches are those of
:class:`~latentloop.tasks.problems.GeneratedProblemTask`: a prompt is held out by its hash.
"""

from __future__ import annotations

import itertools
import re
import string
from dataclasses import dataclass
from typing import Any

import numpy as np

from latentloop.errors import UsageError
from latentloop.tasks.problems import GeneratedProblemTask, growing_range, integer_option, integer_range

LETTERS = string.ascii_lowercase
MODULUS = 10
_STATEMENT = re.compile(r"(?:=([0-9])|([a-z])([1-9]))([a-z])")


@dataclass(frozen=True)
class Chains:
    """Statements ``(variable, parent, digit)`` in prompt order (``parent`` None for a root, whose digit is its
    value; otherwise the digit is added to the parent's value) and the asked variable."""

    statements: tuple[tuple[str, str | None, int], ...]
    query: str

    def values(self) -> dict[str, int]:
        """Every variable's value (mod 10)."""
        values: dict[str, int] = {}
        while len(values) < len(self.statements):
            for name, parent, digit in self.statements:
                if parent is None:
                    values[name] = digit
                elif parent in values:
                    values[name] = (values[parent] + digit) % MODULUS
        return values

    def value(self) -> int:
        """The asked variable's value."""
        return self.values()[self.query]

    def hops(self) -> int:
        """Statements from the asked variable back to its root, both included."""
        parents = {name: parent for name, parent, _ in self.statements}
        count, name = 1, parents[self.query]
        while name is not None:
            count, name = count + 1, parents[name]
        return count


class ChainsTask(GeneratedProblemTask):
    """Variable chains with sums mod 10; see the module docstring.

    Options: ``variables`` (statements per problem, 2-26), ``hops`` (training chain lengths, ``"lo-hi"``;
    by default 1 to 8 or ``variables``), ``hops_warmup`` (training steps over which the longest chain drawn
    grows to the top of ``hops``; 0: no curriculum), ``warmup_variables`` (statements per problem at step 0,
    growing to ``variables`` over ``hops_warmup``; by default ``variables``),
    ``test_hops`` (held-out chain lengths, by default ``hops``), ``test_fraction``, ``test_size``.
    """

    name = "chains"

    def __init__(
        self,
        variables: int | str = 16,
        hops: Any = None,
        test_hops: Any = None,
        hops_warmup: int | str = 0,
        warmup_variables: int | str | None = None,
        test_fraction: float | str = 0.05,
        test_size: int | str = 1000,
    ) -> None:
        self.variables = integer_option(self.name, variables, "variables", 2, len(LETTERS))
        self.hops = (
            (1, min(8, self.variables))
            if hops in (None, "")
            else integer_range(self.name, hops, "hops", 1, self.variables)
        )
        self.test_hops = (
            self.hops
            if test_hops in (None, "")
            else integer_range(self.name, test_hops, "test_hops", 1, self.variables)
        )
        self.hops_warmup = integer_option(self.name, hops_warmup, "hops_warmup", 0, 10**9)
        self.warmup_variables = (
            self.variables
            if warmup_variables in (None, "")
            else integer_option(self.name, warmup_variables, "warmup_variables", self.hops[0], self.variables)
        )
        super().__init__(test_fraction, test_size)
        # Prompt (three characters a statement, then "?x="), answer digit and <eos>, less the last token.
        self.seq_len = 3 * self.variables + 4

    # Problems -------------------------------------------------------------------------------------------------
    def hop_range_at(self, step: int | None) -> tuple[int, int]:
        """The training chain lengths at training ``step``: the curriculum's range while it lasts."""
        return growing_range(self.hops, self.hops_warmup, step)

    def statements_at(self, step: int | None) -> int:
        """Statements per training problem at training ``step`` (``warmup_variables`` growing to ``variables``
        over ``hops_warmup``), never fewer than the longest chain drawn then."""
        if not self.hops_warmup or step is None:
            return self.variables
        grown = self.warmup_variables + int(
            (self.variables - self.warmup_variables) * min(1.0, step / self.hops_warmup)
        )
        return max(grown, self.hop_range_at(step)[1])

    def random_problem(
        self, rng: np.random.Generator, split: str = "train", step: int | None = None
    ) -> Chains:
        """A problem whose asked chain has a length drawn uniformly from the split's hop range (training: the
        range at ``step``, see :meth:`hop_range_at`)."""
        low, high = self.test_hops if split == "test" else self.hop_range_at(step)
        count = self.variables if split == "test" else self.statements_at(step)
        hops = int(rng.integers(low, high + 1))
        names = [LETTERS[i] for i in rng.permutation(len(LETTERS))[:count]]
        lengths = [hops]
        remaining = count - hops
        while remaining:
            lengths.append(int(rng.integers(1, remaining + 1)))
            remaining -= lengths[-1]
        statements = []
        start = 0
        for length in lengths:
            chain = names[start : start + length]
            start += length
            statements.append((chain[0], None, int(rng.integers(MODULUS))))
            statements += [
                (name, parent, int(rng.integers(1, MODULUS))) for parent, name in itertools.pairwise(chain)
            ]
        order = rng.permutation(len(statements))
        return Chains(tuple(statements[i] for i in order), query=names[hops - 1])

    # Text forms -----------------------------------------------------------------------------------------------
    def prompt(self, problem: Chains) -> str:
        """``"=5dc4a=8bb3cd9e?a="``: ``=7x`` for x = 7, ``y3x`` for x = y + 3, then the asked variable."""
        body = "".join(
            f"={d}{n}" if parent is None else f"{parent}{d}{n}" for n, parent, d in problem.statements
        )
        return f"{body}?{problem.query}="

    def answer(self, problem: Chains) -> str:
        """The asked variable's value, one digit."""
        return str(problem.value())

    def format(self, answer: Any, pretty: bool = False) -> str:
        """A problem's prompt (with ``pretty``, spelled out: ``d=5, a=c+4, ...; a = ?``), or an answer."""
        if not isinstance(answer, Chains):
            return str(answer)
        if not pretty:
            return self.prompt(answer)
        body = ", ".join(f"{n}={d}" if p is None else f"{n}={p}+{d}" for n, p, d in answer.statements)
        return f"{body}; {answer.query} = ?"

    def parse(self, text: str) -> Chains:
        """A prompt such as ``"=8bb3cc4a?a="`` -> :class:`Chains`; one-line errors unless every statement reads
        ``=7x`` or ``y3x``, every variable is assigned once, every parent is assigned, no chain loops and the
        asked variable is assigned."""
        match = re.fullmatch(r"\s*([^?]*)\?\s*([a-z])\s*=?\s*", text)
        if not match or len(match.group(1)) % 3:
            raise UsageError(
                f"chains: cannot parse {text!r} (expected three-character statements, e.g. =8bb3c?c=)"
            )
        body, query = match.groups()
        statements = []
        for start in range(0, len(body), 3):
            item = _STATEMENT.fullmatch(body[start : start + 3])
            if not item:
                raise UsageError(
                    f"chains: cannot read statement {body[start : start + 3]!r} (expected =7x for x=7, or y3x for x=y+3)"
                )
            root, parent, digit, name = item.groups()
            statements.append((name, None, int(root)) if root is not None else (name, parent, int(digit)))
        if not statements:
            raise UsageError(f"chains: {text!r} has no statements")
        names = [s[0] for s in statements]
        if len(set(names)) != len(names):
            raise UsageError(f"chains: a variable is assigned twice in {text!r}")
        missing = sorted({s[1] for s in statements if s[1] is not None} - set(names))
        if missing or query not in names:
            raise UsageError(f"chains: {', '.join(missing) or query} is used but never assigned in {text!r}")
        parents = {s[0]: s[1] for s in statements}
        for start in names:
            seen, name = set(), start
            while name is not None:
                if name in seen:
                    raise UsageError(f"chains: the assignments of {text!r} go round in a loop")
                seen.add(name)
                name = parents[name]
        return Chains(tuple(statements), query)

    def verify(self, puzzle: Chains | str, answer: Any) -> bool:
        """True when ``answer`` (an int, or its text, end marker allowed) is the asked variable's value."""
        problem = self.parse(puzzle) if isinstance(puzzle, str) else puzzle
        if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
            return int(answer) == problem.value()
        text = str(answer).strip()
        return bool(re.fullmatch(r"\d+", text)) and int(text) == problem.value()
