"""Permutation products: compose a word of permutations of three objects, so that the depth a problem needs
grows with its length.

The six permutations of ``(0, 1, 2)`` (the group S3) are written as the letters ``a``-``f``; a prompt is a
word of them and ``=``, the answer the one letter of their product, the permutations applied left to right::

    bdf=    ->  d      b = 021, d = 120, f = 210 (p maps object j to p[j]): apply b, then d, then f

Why this measures depth. S3 is not commutative, so the product is not a function of how often each letter
occurs, the shortcut that a constant-depth transformer can take for sums and counts (sums mod n): the order
matters. The direct ways to compose a word go through it one letter at a time or in a tree of pairwise
products. Liu et al. (2023, "Transformers learn shortcuts to automata") study this word problem; S3 is
solvable, so shallow shortcuts exist (they construct them), and whether a model finds one is what its depth
curve shows. A causal model that carries the product so far from one position to the next needs about one
layer per letter, so a recurrent-depth model needs more core iterations for longer words. The product of a
random word is uniform over the six letters, so guessing gets 1/6 whatever the length.

Difficulty is the knob ``length``: training draws the word's length uniformly from its range (with
``length_warmup=N``, from a range whose top grows linearly from the shortest length to the longest over the
first N training steps: a curriculum, a pure function of the step), and ``test_length`` sets the held-out
range, which may lie beyond every length trained (extrapolation). Splits, token layout and batches are those
of :class:`~latentloop.tasks.problems.GeneratedProblemTask`: a prompt is held out by its hash.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from latentloop.errors import UsageError
from latentloop.tasks.problems import (
    GeneratedProblemTask,
    boolean_option,
    growing_range,
    integer_option,
    integer_range,
)

# Letter i is the i-th permutation of (0, 1, 2) in lexicographic order; a permutation p maps object j to p[j].
ELEMENTS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(3)))
LETTERS = "abcdef"
MAX_LENGTH = 200


def compose(first: int, then: int) -> int:
    """The element (index) of applying ``ELEMENTS[first]``, then ``ELEMENTS[then]``."""
    p, q = ELEMENTS[first], ELEMENTS[then]
    return ELEMENTS.index(tuple(q[p[j]] for j in range(3)))


_TABLE = np.array([[compose(i, j) for j in range(6)] for i in range(6)], dtype=np.int64)


@dataclass(frozen=True)
class Word:
    """A word of S3 elements (indices into :data:`ELEMENTS`), applied left to right."""

    letters: tuple[int, ...]

    def product(self) -> int:
        """The index of the word's product (the identity, 0, for the empty word)."""
        products = self.prefix_products()
        return products[-1] if products else 0

    def prefix_products(self) -> list[int]:
        """The product of every prefix: what a model carrying the product from letter to letter holds."""
        value, out = 0, []  # 0: the identity
        for letter in self.letters:
            value = int(_TABLE[value, letter])
            out.append(value)
        return out


class PermutationsTask(GeneratedProblemTask):
    """Products of words over S3; see the module docstring.

    Options: ``length`` (training word lengths, ``"lo-hi"``, default ``1-16``), ``length_warmup`` (training
    steps over which the longest word drawn grows to the top of ``length``; 0: no curriculum), ``test_length``
    (held-out word lengths, by default ``length``), ``prefix_labels`` (training batches also label every
    letter's position with the product of the word up to it, see :meth:`train_batch`), ``test_fraction``,
    ``test_size``.
    """

    name = "permutations"
    counts_label_work = True

    def __init__(
        self,
        length: Any = "1-16",
        test_length: Any = None,
        length_warmup: int | str = 0,
        prefix_labels: bool | str = False,
        test_fraction: float | str = 0.05,
        test_size: int | str = 1000,
    ) -> None:
        self.length = integer_range(self.name, length, "length", 1, MAX_LENGTH)
        self.test_length = (
            self.length
            if test_length in (None, "")
            else integer_range(self.name, test_length, "test_length", 1, MAX_LENGTH)
        )
        self.length_warmup = integer_option(self.name, length_warmup, "length_warmup", 0, 10**9)
        self.prefix_labels = boolean_option(self.name, prefix_labels, "prefix_labels")
        super().__init__(test_fraction, test_size)
        # The longest prompt (word and "="), its answer letter and <eos>, less the last token.
        self.seq_len = max(self.length[1], self.test_length[1]) + 2

    # Problems -------------------------------------------------------------------------------------------------
    def length_range_at(self, step: int | None) -> tuple[int, int]:
        """The training word lengths at training ``step``: the curriculum's range while it lasts."""
        return growing_range(self.length, self.length_warmup, step)

    def random_problem(self, rng: np.random.Generator, split: str = "train", step: int | None = None) -> Word:
        """A word of uniformly random letters, its length uniform over the split's range (training: the range at
        ``step``, see :meth:`length_range_at`)."""
        low, high = self.test_length if split == "test" else self.length_range_at(step)
        size = int(rng.integers(low, high + 1))
        return Word(tuple(int(i) for i in rng.integers(0, len(ELEMENTS), size)))

    def train_batch(self, step: int, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The training batch of ``step`` (a pure function of ``(seed, step)``). With ``prefix_labels`` the
        position of letter ``i`` is also labelled with the letter of the product of letters ``1..i``: the
        model is told what to carry at every position, not only at ``=``. This is the per-position target
        of the prefix-sum tasks of Schwarzschild et al. (2021); it names no intermediate *token*, so the
        products are still computed in the latent iterations. Held-out batches label the answer only."""
        problems = self.training_problems(step, batch_size, seed)
        inputs, labels = self.collate(problems)
        return inputs, self.prefix_labels_of(problems, labels) if self.prefix_labels else labels

    def prefix_labels_of(self, problems: list[Word], labels: torch.Tensor) -> torch.Tensor | None:
        """With ``prefix_labels``, a copy of ``labels`` (collated ``problems``) whose position of letter ``i``
        holds the letter of the product of letters ``1..i``; None without (the position then predicts the
        next letter, which nothing determines)."""
        if not self.prefix_labels:
            return None
        labels = labels.clone()
        for row, problem in enumerate(problems):
            products = "".join(LETTERS[v] for v in problem.prefix_products())
            labels[row, : len(products)] = torch.tensor(self.tokenizer.encode(products))
        return labels

    def label_work(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Letters composed by each position's label: ``i`` for the position of the ``i``-th letter (labelled
        with the product of letters ``1..i`` under ``prefix_labels``), the word's length at ``=`` (the
        answer), 0 after it (the end marker) and at padding."""
        letters = torch.isin(input_ids, torch.tensor(self.tokenizer.encode(LETTERS), device=input_ids.device))
        equals = input_ids == self.tokenizer.encode("=")[0]
        # A letter after "=" is the answer read back, not part of the word.
        in_word = letters & (torch.cumsum(equals.long(), dim=1) == 0)
        work = torch.cumsum(in_word.long(), dim=1)
        return torch.where(in_word | equals, work, torch.zeros_like(work))

    # Text forms -----------------------------------------------------------------------------------------------
    def prompt(self, problem: Word) -> str:
        """``"bdf="``: the word's letters, then ``=``."""
        return "".join(LETTERS[i] for i in problem.letters) + "="

    def answer(self, problem: Word) -> str:
        """The product's letter."""
        return LETTERS[problem.product()]

    def format(self, answer: Any, pretty: bool = False) -> str:
        """A problem's prompt (with ``pretty``, each letter as the permutation it stands for), or an answer."""
        if not isinstance(answer, Word):
            return str(answer)
        if not pretty:
            return self.prompt(answer)
        return " ".join("".join(map(str, ELEMENTS[i])) for i in answer.letters) + " = ?"

    def parse(self, text: str) -> Word:
        """A prompt such as ``"bdf="`` (the ``=`` optional) -> :class:`Word`; one-line errors unless it is
        1..MAX_LENGTH letters a-f."""
        match = re.fullmatch(r"\s*([a-z]*)\s*=?\s*", text)
        if not match or not match.group(1):
            raise UsageError(
                f"permutations: cannot parse {text!r} (expected a word of letters a-f, e.g. bdf=)"
            )
        word = match.group(1)
        bad = sorted(set(word) - set(LETTERS))
        if bad:
            raise UsageError(f"permutations: {''.join(bad)!r} in {text!r} is not one of the letters a-f")
        if len(word) > MAX_LENGTH:
            raise UsageError(f"permutations: {text!r} is longer than {MAX_LENGTH} letters")
        return Word(tuple(LETTERS.index(c) for c in word))

    def verify(self, puzzle: Word | str, answer: Any) -> bool:
        """True when ``answer`` (a letter, end marker allowed, or an element index) is the word's product."""
        problem = self.parse(puzzle) if isinstance(puzzle, str) else puzzle
        if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
            return int(answer) == problem.product()
        return str(answer).strip() == LETTERS[problem.product()]
