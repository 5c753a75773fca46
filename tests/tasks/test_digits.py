"""Digits: scikit-learn's bundled 8x8 set and local MNIST files (IDX, gzip, npz), binarised."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latentloop.errors import UsageError
from latentloop.tasks import get_task


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _fake_mnist(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, 256, size=(count, 28, 28)).astype(np.uint8), rng.integers(
        0, 10, size=count
    ).astype(np.uint8)


def test_sklearn_digits() -> None:
    task = get_task("digits")
    train, labels = task.images("train")
    test, _ = task.images("test")
    assert train.shape == (1527, 8, 8) and test.shape == (270, 8, 8)
    assert set(np.unique(train)) == {0, 1} and set(np.unique(labels)) == set(range(10))
    x, y = next(iter(task.examples("train")))
    assert (x == -1).all() and task.verify(x, y)


def test_mnist_idx_folder_with_gzip(tmp_path) -> None:
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 12), ("t10k", 5)):
        images, labels = _fake_mnist(rng, count)
        (tmp_path / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(images)))
        (tmp_path / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx_bytes(labels))
    task = get_task("digits", path=str(tmp_path))
    images, labels = task.images("train")
    assert task.shape == (28, 28) and images.shape == (12, 28, 28) and len(labels) == 12
    assert task.images("test")[0].shape == (5, 28, 28)
    assert len(list(task.records("train", 0, 4))) == 4


def test_mnist_single_idx_and_npz(tmp_path) -> None:
    rng = np.random.default_rng(1)
    images, labels = _fake_mnist(rng, 20)
    (tmp_path / "images.idx").write_bytes(_idx_bytes(images))
    task = get_task("digits", path=str(tmp_path / "images.idx"), threshold="0.25")
    train, test = task.images("train")[0], task.images("test")[0]
    assert len(train) == 17 and len(test) == 3  # split 85:15
    np.savez(
        tmp_path / "mnist.npz",
        x_train=images[:15],
        y_train=labels[:15],
        x_test=images[15:],
        y_test=labels[15:],
    )
    npz = get_task("digits", path=str(tmp_path / "mnist.npz"))
    assert (npz.images("test")[0] == (images[15:] / 255.0 >= 0.5)).all()


@pytest.mark.parametrize(
    "content", [b"", b"not an idx file", bytes([0, 0, 8, 3, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0, 0, 2]) + b"\x00"]
)
def test_malformed_idx(tmp_path, content: bytes) -> None:
    path = tmp_path / "bad-images-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(UsageError):
        get_task("digits", path=str(path))


def test_bad_options(tmp_path) -> None:
    for options in ({"path": str(tmp_path / "missing.npz")}, {"threshold": "2"}, {"threshold": "x"}):
        with pytest.raises(UsageError):
            get_task("digits", **options)
    (tmp_path / "wrong.npz").write_bytes(b"junk")
    with pytest.raises(UsageError):
        get_task("digits", path=str(tmp_path / "wrong.npz"))


@settings(max_examples=40, deadline=None)
@given(cells=st.lists(st.sampled_from([-1, 0, 1]), min_size=64, max_size=64))
def test_encode_decode_round_trip(cells: list[int]) -> None:
    task = get_task("digits")
    image = np.array(cells, dtype=np.int8).reshape(8, 8)
    assert (task.decode(task.encode(image)) == image).all()
    assert (task.parse(task.format(image)) == image).all()


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, 269), cell=st.integers(0, 63))
def test_inpainting_answer_must_keep_known_pixels(index: int, cell: int) -> None:
    task = get_task("digits")
    image = task.images("test")[0][index]
    puzzle = image.copy()
    puzzle.ravel()[: cell + 1] = -1  # the first pixels are to be filled in
    assert task.verify(puzzle, image)
    changed = image.copy()
    changed.ravel()[cell] ^= 1  # an unknown pixel: any binary value is fine
    assert task.verify(puzzle, changed)
    flipped = image.copy()
    flipped.ravel()[-1] ^= 1
    assert task.verify(puzzle, flipped) == (cell == 63)
    assert task.violations(puzzle, np.full((8, 8), 2, np.int8)) == 64 + int((puzzle >= 0).sum())
