"""A puzzle task added as one file plus its registration: flip every bit of a string of ``n`` bits (text
form ``0110``). Only the abstract methods and the sizes are written; every other capability keeps its
default."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from latentloop.errors import UsageError
from latentloop.tasks.base import Task


class FlipTask(Task):
    """Puzzle: ``n`` bits; the one valid answer: the same bits flipped. Tokens: 0 pad, 1 = bit 0, 2 = bit 1."""

    name = "flip"
    vocab_size = 3

    def __init__(self, n: int = 6) -> None:
        self.n = self.seq_len = int(n)

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
        strings = list(itertools.product((0, 1), repeat=self.n))
        order = np.random.default_rng(seed).permutation(len(strings))
        cut = len(strings) * 3 // 4
        for index in order[:cut] if split == "train" else order[cut:]:
            bits = strings[int(index)]
            yield bits, tuple(1 - b for b in bits)

    def encode(self, puzzle: tuple[int, ...]) -> np.ndarray:
        return np.asarray(puzzle, dtype=np.uint8) + 1

    def decode(self, tokens: np.ndarray) -> tuple[int, ...]:
        return tuple(int(t) - 1 for t in tokens)

    def verify(self, puzzle: tuple[int, ...], answer: tuple[int, ...]) -> bool:
        return len(answer) == self.n and all(a == 1 - p for p, a in zip(puzzle, answer, strict=True))

    def parse(self, text: str) -> tuple[int, ...]:
        if len(text) != self.n or set(text) - {"0", "1"}:
            raise UsageError(f"a flip puzzle is {self.n} characters of 0 and 1, got {text!r}")
        return tuple(int(c) for c in text)

    def format(self, answer: tuple[int, ...], pretty: bool = False) -> str:
        return "".join(str(max(b, 0)) for b in answer)
