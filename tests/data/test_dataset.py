"""The on-disk dataset: layout, determinism, atomic writes, ids and groups."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from latentloop.data.dataset import ARRAYS, build_dataset, load_dataset
from latentloop.errors import UsageError
from latentloop.tasks import get_task
from latentloop.tasks.nqueens import NQueensTask


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_layout_and_counts(tmp_path) -> None:
    task = get_task("nqueens", n=6)
    metadata = build_dataset(task, tmp_path / "nq6", seed=1)
    data = load_dataset(tmp_path / "nq6")
    assert data.metadata == json.loads((tmp_path / "nq6" / "metadata.json").read_text())
    assert metadata["seq_len"] == 36 and metadata["vocab_size"] == 3 and metadata["task"] == "nqueens"
    for split in ("train", "test"):
        arrays = data.split(split)
        rows = metadata["counts"][split]["rows"]
        assert arrays["inputs"].shape == arrays["labels"].shape == (rows, 36)
        assert arrays["inputs"].dtype == np.uint8 and arrays["puzzle_ids"].dtype == np.int32
        assert len(np.unique(arrays["puzzle_ids"])) == metadata["counts"][split]["puzzles"]
        for i in range(rows):  # every label is a valid completion of its input
            assert task.verify(task.decode(arrays["inputs"][i]), task.decode(arrays["labels"][i]))
        # Rows with the same puzzle id have the same input.
        for pid in np.unique(arrays["puzzle_ids"]):
            same = arrays["inputs"][arrays["puzzle_ids"] == pid]
            assert (same == same[0]).all()
    assert not set(data.split("train")["puzzle_ids"]) & set(data.split("test")["puzzle_ids"])


def test_deterministic_for_a_seed(tmp_path) -> None:
    task = get_task("sudoku", n=4, augment=2)
    build_dataset(task, tmp_path / "a", size=10, test_size=3, seed=5)
    build_dataset(task, tmp_path / "b", size=10, test_size=3, seed=5)
    build_dataset(task, tmp_path / "c", size=10, test_size=3, seed=6)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert _files(tmp_path / "a") != _files(tmp_path / "c")
    train = load_dataset(tmp_path / "a").split("train")
    assert len(train["inputs"]) == 30 and len(np.unique(train["groups"])) == 10  # 2 augmented copies each


def test_existing_output_needs_force(tmp_path) -> None:
    task = get_task("nqueens", n=5)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="--force"):
        build_dataset(task, out)
    assert _files(out) == {"keep.txt": b"mine"}
    build_dataset(task, out, force=True)
    assert not (out / "keep.txt").exists() and (out / "metadata.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folders left
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        build_dataset(task, tmp_path / "file")


class _FailingTask(NQueensTask):
    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple]:
        yield from list(super().records(split, seed, size))[:3]
        raise UsageError("malformed input found half way")


def test_failure_half_way_writes_nothing(tmp_path) -> None:
    with pytest.raises(UsageError, match="half way"):
        build_dataset(_FailingTask(n=6), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_arc_puzzle_ids_are_shared_across_splits(tmp_path) -> None:
    task = get_task("arc-agi-1", augment=1)
    metadata = build_dataset(task, tmp_path / "arc", size=3, test_size=2)
    data = load_dataset(tmp_path / "arc")
    train, test = data.split("train"), data.split("test")
    assert set(test["puzzle_ids"]) <= set(train["puzzle_ids"])
    assert metadata["counts"]["test"]["groups"] == 2
    info = metadata["puzzles"][str(int(test["puzzle_ids"][0]))]
    assert set(info) == {"task", "transform"}


def test_load_errors(tmp_path) -> None:
    with pytest.raises(UsageError):
        load_dataset(tmp_path)
    (tmp_path / "metadata.json").write_text('{"format": "other"}')
    with pytest.raises(UsageError):
        load_dataset(tmp_path)


def test_validation_split_holds_out_the_last_training_groups(tmp_path) -> None:
    task = get_task("sudoku", n=4, augment=2)
    build_dataset(task, tmp_path / "whole", size=10, test_size=3, seed=5)
    metadata = build_dataset(task, tmp_path / "held", size=10, test_size=3, seed=5, validation=3)
    whole, held = load_dataset(tmp_path / "whole"), load_dataset(tmp_path / "held")
    train, validation = held.split("train"), held.split("validation")
    assert metadata["counts"]["validation"] == {"rows": 9, "puzzles": 9, "groups": 3}  # 3 copies each
    assert metadata["counts"]["train"]["groups"] == 7
    # Every augmented copy of a held-out puzzle leaves train: no group is in both.
    assert not set(train["groups"].tolist()) & set(validation["groups"].tolist())
    # The two splits are the whole training split, cut at its last three groups; test is untouched.
    original = whole.split("train")
    last = list(dict.fromkeys(original["groups"].tolist()))[-3:]
    assert sorted(set(validation["groups"].tolist())) == sorted(last)
    rows = np.concatenate([train["inputs"], validation["inputs"]])
    assert sorted(map(bytes, rows)) == sorted(map(bytes, original["inputs"]))
    for name in ARRAYS:
        assert (held.split("test")[name] == whole.split("test")[name]).all()
    with pytest.raises(UsageError, match=r"no validation split.*train\.validation"):
        whole.split("validation")


@pytest.mark.parametrize("validation, message", [(-1, "at least 0"), (10, "leaves nothing to train on")])
def test_impossible_validation_split(tmp_path, validation, message) -> None:
    task = get_task("sudoku", n=4)
    with pytest.raises(UsageError, match=message):
        build_dataset(task, tmp_path / "out", size=10, test_size=3, validation=validation)
    assert not (tmp_path / "out").exists()
