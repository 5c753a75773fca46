"""Generated text problems for the recurrent-depth language model: the part every such task shares.

A subclass says how to draw a random problem, write its prompt and canonical answer, and read an answer back; this
base turns that into the language model's data:

- **Held-out split by construction.** A problem is a *test* problem exactly when a stable hash (BLAKE2b) of
  its prompt text falls into the lowest ``test_fraction`` of buckets. Training draws skip those, so train and
  test are disjoint for every seed and however long training runs.
- **Token layout** (byte-level ids, :mod:`latentloop.data.tokenizers`): ``input_ids`` is prompt + answer
  without the final token; ``labels`` is ``IGNORE_LABEL`` (-100) over the prompt, then the answer tokens and
  ``<eos>`` aligned with the positions that predict them; every example is padded to :attr:`seq_len`.
- **Batches as pure functions.** Training batch ``step`` depends only on ``(seed, step)``, so resuming needs
  no data state.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
import torch

from latentloop.data.labels import IGNORE_LABEL
from latentloop.data.tokenizers import ByteTokenizer
from latentloop.errors import UsageError
from latentloop.tasks.base import Task

DATA_STREAM = 0xDA7A  # mixed into every data seed so data draws never share a stream with depth draws
_BUCKETS = 1_000_000
_TEST_STREAM = 0x7E57


def integer_option(task: str, value: Any, name: str, low: int, high: int) -> int:
    """``value`` as an integer in ``low..high``; a one-line :class:`UsageError` naming ``task`` and ``name``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{task}: {name} must be an integer, got {value!r}") from None
    if not number.is_integer() or not low <= number <= high:
        raise UsageError(f"{task}: {name} must be an integer in {low}..{high}, got {value!r}")
    return int(number)


def boolean_option(task: str, value: Any, name: str) -> bool:
    """``value`` (a bool or true/false, yes/no, 1/0) as a bool; a one-line :class:`UsageError` naming ``task``
    and ``name``."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("true", "false", "yes", "no", "1", "0"):
        raise UsageError(f"{task}: {name} must be true or false, got {value!r}")
    return text in ("true", "yes", "1")


def integer_range(task: str, value: Any, name: str, low: int, high: int) -> tuple[int, int]:
    """``"3-8"``, ``[3, 8]`` or ``5`` as an inclusive range within ``low..high``; a one-line
    :class:`UsageError` naming ``task`` and ``name``."""
    if isinstance(value, str) and "-" in value:
        parts: list[Any] = value.split("-", 1)
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value, value]
    if len(parts) != 2:
        raise UsageError(f"{task}: {name} must be a whole number or a range such as 2-8, got {value!r}")
    first, last = (integer_option(task, part, name, low, high) for part in parts)
    if first > last:
        raise UsageError(f"{task}: {name} must run from low to high, got {value!r}")
    return first, last


def growing_range(full: tuple[int, int], warmup: int, step: int | None) -> tuple[int, int]:
    """A curriculum over a difficulty range: at training ``step`` the top grows linearly from ``full[0]`` to
    ``full[1]`` over the first ``warmup`` steps (``warmup`` 0, or no step: the full range)."""
    low, high = full
    if warmup and step is not None:
        high = low + int((high - low) * min(1.0, step / warmup))
    return low, high


class GeneratedProblemTask(Task):
    """A language-model task over generated problems with one canonical text answer each (``exact_match``).

    Subclasses set :attr:`seq_len` (the longest prompt + answer + ``<eos>``, less one) and implement
    :meth:`random_problem`, :meth:`prompt`, :meth:`answer` and :meth:`verify`.
    """

    metric = "exact_match"
    trains_language_model = True

    def __init__(self, test_fraction: float | str = 0.05, test_size: int | str = 1000) -> None:
        try:
            self.test_fraction = float(test_fraction)
        except (TypeError, ValueError):
            raise UsageError(f"{self.name}: test_fraction must be a number, got {test_fraction!r}") from None
        if not 0 < self.test_fraction <= 0.5:
            raise UsageError(f"{self.name}: test_fraction must be in (0, 0.5], got {test_fraction!r}")
        self.test_size = integer_option(self.name, test_size, "test_size", 1, 10_000_000)
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self._threshold = round(self.test_fraction * _BUCKETS)
        self._test: list[Any] | None = None

    # What a subclass defines --------------------------------------------------------------------------------
    @abstractmethod
    def random_problem(self, rng: np.random.Generator, split: str, step: int | None = None) -> Hashable:
        """One random problem of the distribution of ``split`` ("train" or "test"), before the hash split;
        ``step`` is the training step the draw is for (None outside training), for tasks with a curriculum."""

    @abstractmethod
    def prompt(self, problem: Any) -> str:
        """The prompt text the model reads."""

    @abstractmethod
    def answer(self, problem: Any) -> str:
        """The canonical answer text (without the end marker)."""

    # Text -----------------------------------------------------------------------------------------------------
    def encode(self, puzzle: Any) -> list[int]:
        """Token ids of a problem's prompt (or of any text)."""
        return self.tokenizer.encode(puzzle if isinstance(puzzle, str) else self.prompt(puzzle))

    def decode(self, tokens: Any) -> str:
        """Text of token ids, stopping at the first ``<eos>``."""
        ids = [int(t) for t in tokens]
        if self.tokenizer.eos_id in ids:
            ids = ids[: ids.index(self.tokenizer.eos_id)]
        return self.tokenizer.decode(ids)

    # Splits ---------------------------------------------------------------------------------------------------
    def is_test(self, problem: Any) -> bool:
        """Whether ``problem`` belongs to the held-out split (a stable hash of its prompt text)."""
        digest = hashlib.blake2b(self.prompt(problem).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % _BUCKETS < self._threshold

    def sample_train(self, rng: np.random.Generator, step: int | None = None) -> Any:
        """A random training problem for training step ``step`` (test problems are redrawn)."""
        while True:
            problem = self.random_problem(rng, "train", step)
            if not self.is_test(problem):
                return problem

    def test_problems(self) -> list[Any]:
        """The fixed held-out problems (at most ``test_size``, distinct), identical for every seed and run."""
        if self._test is None:
            rng = np.random.default_rng([DATA_STREAM, _TEST_STREAM])
            seen: set[Any] = set()
            tests: list[Any] = []
            for _ in range(self.test_size * 200):
                problem = self.random_problem(rng, "test")
                if problem not in seen and self.is_test(problem):
                    seen.add(problem)
                    tests.append(problem)
                    if len(tests) == self.test_size:
                        break
            if not tests:
                raise UsageError(f"{self.name}: the held-out split is empty; raise test_fraction")
            self._test = tests
        return self._test

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[Any, str]]:
        """``(problem, answer text)``: endless fresh draws for ``"train"``, the fixed list for ``"test"``."""
        if split == "test":
            for problem in self.test_problems():
                yield problem, self.answer(problem)
        elif split == "train":
            rng = np.random.default_rng([DATA_STREAM, int(seed) & 0xFFFFFFFF])
            while True:
                problem = self.sample_train(rng)
                yield problem, self.answer(problem)
        else:
            raise UsageError(f"{self.name}: unknown split {split!r} (train or test)")

    # Tensors --------------------------------------------------------------------------------------------------
    def encode_example(self, problem: Any) -> tuple[list[int], list[int]]:
        """``(input_ids, labels)`` of one example, padded to :attr:`seq_len`."""
        prompt = self.encode(problem)
        answer = [*self.tokenizer.encode(self.answer(problem)), self.tokenizer.eos_id]
        full = prompt + answer
        inputs = full[:-1]
        labels = [IGNORE_LABEL] * (len(prompt) - 1) + answer
        pad = self.seq_len - len(inputs)
        return inputs + [self.tokenizer.pad_id] * pad, labels + [IGNORE_LABEL] * pad

    def collate(self, problems: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` int64 tensors [B, seq_len] for ``problems``."""
        pairs = [self.encode_example(p) for p in problems]
        return (
            torch.tensor([p[0] for p in pairs], dtype=torch.long),
            torch.tensor([p[1] for p in pairs], dtype=torch.long),
        )

    def train_batch(self, step: int, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The training batch of ``step``: a pure function of ``(seed, step)``, so resuming needs no data state."""
        return self.collate(self.training_problems(step, batch_size, seed))

    def training_problems(self, step: int, batch_size: int, seed: int = 0) -> list[Any]:
        """The problems of training batch ``step`` (what :meth:`train_batch` collates)."""
        rng = np.random.default_rng([DATA_STREAM, int(seed) & 0xFFFFFFFF, int(step)])
        return [self.sample_train(rng, int(step)) for _ in range(batch_size)]

    def heldout_batches(
        self, batch_size: int, limit: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[Any]]]:
        """The held-out problems as ``(input_ids, labels, problems)`` batches (the first ``limit`` problems)."""
        problems = self.test_problems()[:limit] if limit else self.test_problems()
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            yield (*self.collate(chunk), chunk)
