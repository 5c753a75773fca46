"""Binarised handwritten digits for unconditional generation (GRAM samples p(x), scored on MNIST).

Sources: the 8x8 digits that ship with scikit-learn (default, offline), or MNIST (28x28) from a local file
given as option ``path``: an ``.npz`` with ``x_train``/``x_test`` (and ``y_train``/``y_test``), as Keras
ships it, or IDX files (``train-images-idx3-ubyte[.gz]``...): a folder holding the standard MNIST names or a
single images file (then split 85:15).

An image is an ``int8`` array: 1 = ink, 0 = background, -1 = unknown. A *puzzle* is an image whose unknown
pixels are to be filled (all unknown for unconditional generation); an answer must be binary and keep the
known pixels. Tokens: 0 = pad, 1 = unknown, 2 = background, 3 = ink. Dataset rows have all-unknown inputs
and the image as the label; the group is the digit class (-1 when the source has no labels).
"""

from __future__ import annotations

import functools
import gzip
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.datasets import load_digits

from latentloop.errors import UsageError
from latentloop.tasks.base import Task

PAD, UNKNOWN, OFF, ON = 0, 1, 2, 3
_IDX_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """An array from an IDX file (MNIST's format; gzip allowed)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as error:
        raise UsageError(
            f"cannot read IDX file {str(path)!r}: {getattr(error, 'strerror', None) or error}"
        ) from None
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise UsageError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise UsageError(f"{path}: IDX header says shape {shape}, the file holds {data.size} values")
    return data.reshape(shape)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


@functools.lru_cache(maxsize=4)
def load_images(path: str | None, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images [N, H, W] in 0..1, labels [N]), "test": ...}`` from a local file, or else from
    scikit-learn's bundled 8x8 digits (no download)."""
    if path is None:
        bunch = load_digits()
        return _split(bunch.images / 16.0, bunch.target, seed)
    source = Path(path)
    if source.is_dir():
        splits = {}
        for split, (images, labels) in _IDX_NAMES.items():
            found = _find(source, images)
            if found is None:
                raise UsageError(f"{source}: no {images}[.gz] (the standard MNIST IDX names)")
            label_file = _find(source, labels)
            y = read_idx(label_file) if label_file else np.full(len(read_idx(found)), -1)
            splits[split] = (read_idx(found) / 255.0, y)
        return splits
    if source.suffix == ".npz":
        try:
            with np.load(source) as data:
                arrays = {key: data[key] for key in data.files}
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot read {str(source)!r} as an .npz file: {error}") from None
        if "x_train" not in arrays or "x_test" not in arrays:
            raise UsageError(f"{source}: expected arrays x_train and x_test (and y_train, y_test)")
        scale = 255.0 if arrays["x_train"].max() > 1 else 1.0
        return {
            split: (
                arrays[f"x_{split}"] / scale,
                arrays.get(f"y_{split}", np.full(len(arrays[f"x_{split}"]), -1)),
            )
            for split in ("train", "test")
        }
    images = read_idx(source)
    if images.ndim != 3:
        raise UsageError(f"{source}: expected an IDX file of images [N, H, W], got shape {images.shape}")
    return _split(images / 255.0, np.full(len(images), -1), seed)


def _split(images: np.ndarray, labels: np.ndarray, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    order = np.random.default_rng(seed).permutation(len(images))
    cut = round(0.85 * len(images))
    return {
        "train": (images[order[:cut]], labels[order[:cut]]),
        "test": (images[order[cut:]], labels[order[cut:]]),
    }


class DigitsTask(Task):
    """Binarised digit images. Options: ``path`` (local MNIST file or folder), ``threshold`` (default 0.5)."""

    name = "digits"
    has_blank = True
    image_answers = True

    def __init__(self, path: str | None = None, threshold: float | str = 0.5) -> None:
        if path is not None and not Path(path).exists():
            raise UsageError(f"option path: no such file or folder {path!r}")
        self.path = str(path) if path is not None else None
        try:
            self.threshold = float(threshold)
        except (TypeError, ValueError):
            raise UsageError(f"option threshold must be a number, got {threshold!r}") from None
        if not 0.0 < self.threshold < 1.0:
            raise UsageError(f"option threshold must be between 0 and 1, got {self.threshold}")
        self.shape = (8, 8) if path is None else tuple(load_images(self.path)["train"][0].shape[1:])
        self.seq_len = int(np.prod(self.shape))
        self.vocab_size = 4

    def images(self, split: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Binary images ``[N, H, W]`` (int8) and labels of ``split``."""
        if split not in ("train", "test"):
            raise UsageError(f"split must be 'train' or 'test', got {split!r}")
        images, labels = load_images(self.path, seed)[split]
        return (images >= self.threshold).astype(np.int8), np.asarray(labels)

    def blank(self) -> np.ndarray:
        """The all-unknown puzzle of unconditional generation."""
        return np.full(self.shape, -1, dtype=np.int8)

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(all-unknown puzzle, binary image)`` pairs."""
        images, _ = self.images(split, seed)
        for image in images:
            yield self.blank(), image

    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows: blank input, image label; the group is the digit class."""
        images, labels = self.images(split, seed)
        blank = self.encode(self.blank())
        for index, (image, label) in enumerate(zip(images[:size], labels[:size], strict=True)):
            yield blank, self.encode(image), index, int(label), None

    def encode(self, puzzle: np.ndarray) -> np.ndarray:
        """Tokens: 1 unknown, 2 background, 3 ink."""
        image = np.asarray(puzzle)
        if image.shape != self.shape or image.min() < -1 or image.max() > 1:
            raise UsageError(f"not a {self.shape[0]}x{self.shape[1]} image of -1/0/1")
        return (image.reshape(-1) + 2).astype(np.uint8)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """The image of ``tokens`` (pad reads as unknown)."""
        tokens = np.asarray(tokens).reshape(self.shape).astype(np.int16)
        return np.where(tokens >= OFF, np.minimum(tokens, ON) - 2, -1).astype(np.int8)

    def verify(self, puzzle: np.ndarray, answer: np.ndarray) -> bool:
        """True when ``answer`` is binary and keeps every known pixel of ``puzzle``."""
        return self.violations(puzzle, answer) == 0

    def violations(self, puzzle: np.ndarray, answer: np.ndarray) -> int:
        """Pixels that are not 0/1 plus known pixels that changed."""
        puzzle, answer = np.asarray(puzzle), np.asarray(answer)
        if puzzle.shape != answer.shape:
            raise UsageError(f"the answer is {answer.shape}, the puzzle {puzzle.shape}")
        return int(((answer != 0) & (answer != 1)).sum() + ((puzzle >= 0) & (puzzle != answer)).sum())

    def parse(self, text: str) -> np.ndarray:
        """An image from text: '1' or '#' ink, '0' or '.' background, '?' unknown; whitespace and '|' ignored."""
        cells = re.sub(r"[\s|]", "", text)
        size = self.seq_len
        if len(cells) != size:
            raise UsageError(f"a {self.shape[0]}x{self.shape[1]} image needs {size} cells, got {len(cells)}")
        table = {"1": 1, "#": 1, "0": 0, ".": 0, "?": -1}
        bad = sorted(set(cells) - set(table))
        if bad:
            raise UsageError(
                f"unexpected character {bad[0]!r} in an image ('1'/'#' ink, '0'/'.' background, '?' unknown)"
            )
        return np.array([table[ch] for ch in cells], dtype=np.int8).reshape(self.shape)

    def parse_answer(self, text: str, puzzle: np.ndarray | None = None) -> np.ndarray:
        """An answer image (same text form)."""
        return self.parse(text)

    def format(self, answer: np.ndarray, pretty: bool = False) -> str:
        """Rows of '#', '.' and '?' separated by '|', or one row per line when ``pretty``."""
        chars = {1: "#", 0: ".", -1: "?"}
        return ("\n" if pretty else "|").join(
            "".join(chars[int(v)] for v in row) for row in np.asarray(answer)
        )

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task."""
        return {
            "source": self.path or "sklearn digits",
            "shape": list(self.shape),
            "threshold": self.threshold,
            "tokens": {"pad": PAD, "unknown": UNKNOWN, "background": OFF, "ink": ON},
        }
