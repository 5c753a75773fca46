"""Next-token prediction on plain text: local files, or the embedded default corpus (no download needed).

The files are tokenized (byte-level by default, or a Hugging Face ``tokenizer.json``), joined with ``<eos>``
between documents into one token stream, and split by position: the last ``heldout_fraction`` (5% by default)
of the stream is held out for perplexity, the rest is for training. Training windows of ``seq_len + 1`` tokens
start at random offsets inside the training part; held-out windows tile the held-out part without overlap.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentloop.data.tokenizers import Tokenizer, load_tokenizer
from latentloop.errors import UsageError
from latentloop.tasks.base import Task

DEFAULT_CORPUS = "corpus.txt"  # inside the latentloop.resources package data
_DATA_STREAM = 0xDA7A


def default_corpus_text() -> str:
    """The embedded default corpus (public-domain prose shipped in ``latentloop/resources``)."""
    return resources.files("latentloop").joinpath("resources", DEFAULT_CORPUS).read_text(encoding="utf-8")


def _paths(value: Any) -> list[Path]:
    if value is None or value == "" or value == []:
        return []
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    paths: list[Path] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not found:
                raise UsageError(f"text: folder {path} holds no .txt files")
            paths.extend(found)
        elif path.is_file():
            paths.append(path)
        else:
            raise UsageError(f"text: file {path} does not exist")
    return paths


class TextTask(Task):
    """Language modelling on text files; see the module docstring.

    Options: ``paths`` (files or folders of ``.txt``, comma-separated or a list; default: the embedded corpus),
    ``tokenizer`` (``"byte"`` or a ``tokenizer.json`` path), ``seq_len`` (tokens per training window),
    ``heldout_fraction`` (share of the stream, from its end, held out).
    """

    name = "text"
    metric = "perplexity"
    trains_language_model = True

    def __init__(
        self,
        paths: str | list[str] | None = None,
        tokenizer: str | None = "byte",
        seq_len: int | str = 128,
        heldout_fraction: float | str = 0.05,
    ) -> None:
        try:
            self.seq_len = int(seq_len)
            self.heldout_fraction = float(heldout_fraction)
        except (TypeError, ValueError):
            raise UsageError(
                f"text: bad seq_len {seq_len!r} or heldout_fraction {heldout_fraction!r}"
            ) from None
        if self.seq_len < 1:
            raise UsageError(f"text: seq_len must be positive, got {seq_len!r}")
        if not 0 < self.heldout_fraction < 1:
            raise UsageError(f"text: heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer)
        self.vocab_size = self.tokenizer.vocab_size
        self.files = _paths(paths)
        texts = [self._read(p) for p in self.files] if self.files else [default_corpus_text()]
        ids: list[int] = []
        for text in texts:
            ids.extend(self.tokenizer.encode(text))
            ids.append(self.tokenizer.eos_id)
        self.stream = np.asarray(ids, dtype=np.int64)
        self.split_at = round(len(self.stream) * (1 - self.heldout_fraction))
        window = self.seq_len + 1
        if self.split_at < window or len(self.stream) - self.split_at < window:
            raise UsageError(
                f"text: corpus of {len(self.stream)} tokens is too small for seq_len {self.seq_len} with "
                f"{self.heldout_fraction:.0%} held out; lower seq_len or add text"
            )

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"text: {path} is not UTF-8 text") from None
        except OSError as error:
            raise UsageError(f"text: cannot read {path}: {error.strerror or error}") from None

    # Task interface -------------------------------------------------------------------------------------------
    def encode(self, puzzle: str) -> list[int]:
        """Token ids of ``puzzle`` text."""
        return self.tokenizer.encode(puzzle)

    def decode(self, tokens: Any) -> str:
        """Text of token ids."""
        return self.tokenizer.decode([int(t) for t in tokens])

    def verify(self, puzzle: Any, answer: Any) -> bool:
        """For text, an answer is "correct" when it equals the reference continuation ``puzzle[1]`` of a
        ``(context, continuation)`` example exactly."""
        _, continuation = puzzle
        return list(map(int, answer)) == list(map(int, continuation))

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[list[int], list[int]]]:
        """``(input ids, next-token ids)`` windows: random ones from training text, or the held-out tiling."""
        if split == "train":
            step = 0
            while True:
                inputs, labels = self.train_batch(step, 1, seed)
                yield inputs[0].tolist(), labels[0].tolist()
                step += 1
        elif split == "test":
            for inputs, labels, _ in self.heldout_batches(1):
                yield inputs[0].tolist(), labels[0].tolist()
        else:
            raise UsageError(f"text: unknown split {split!r} (train or test)")

    # Tensors --------------------------------------------------------------------------------------------------
    def train_batch(self, step: int, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Random training windows for ``step``: a pure function of ``(seed, step)``."""
        rng = np.random.default_rng([_DATA_STREAM, int(seed) & 0xFFFFFFFF, int(step)])
        starts = rng.integers(0, self.split_at - self.seq_len, size=batch_size)  # window ends inside training
        windows = np.stack([self.stream[s : s + self.seq_len + 1] for s in starts])
        tensor = torch.from_numpy(windows)
        return tensor[:, :-1].contiguous(), tensor[:, 1:].contiguous()

    def heldout_batches(
        self, batch_size: int, limit: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, None]]:
        """Non-overlapping held-out windows (at most ``limit``) as ``(input_ids, labels, None)`` batches."""
        held = self.stream[self.split_at :]
        count = (len(held) - 1) // self.seq_len
        if limit:
            count = min(count, limit)
        starts = [i * self.seq_len for i in range(count)]
        for first in range(0, count, batch_size):
            windows = np.stack([held[s : s + self.seq_len + 1] for s in starts[first : first + batch_size]])
            tensor = torch.from_numpy(windows)
            yield tensor[:, :-1].contiguous(), tensor[:, 1:].contiguous(), None
