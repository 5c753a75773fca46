"""The on-disk puzzle dataset: token arrays per split plus ``metadata.json``, written atomically.

Layout of a dataset folder::

    metadata.json                 task, options, seed, seq_len, vocab_size, token ids, counts, puzzle info
    train/inputs.npy              uint8 [rows, seq_len]   token ids (0 = pad everywhere)
    train/labels.npy              uint8 [rows, seq_len]   token ids; 0 marks positions that are not scored
                                                          (IGNORE_LABEL once loaded, see data/labels.py)
    train/puzzle_ids.npy          int32 [rows]            rows with the same input share an id (and ARC's
                                                          puzzle embedding); ids are shared across splits
    train/groups.npy              int32 [rows]            the original problem: augmented copies and all
                                                          completions of one input share a group
    test/...                      the same
    validation/...                the same, when built with ``validation`` > 0: training puzzles held out of
                                  train/ (every row of their group), to tune on without touching test/

Rows come from the task's ``records(split, seed, size)``, which yields ``(inputs, labels, puzzle_key,
group_key, info)`` (by default from ``examples()``, one puzzle per distinct input). Keys are scoped to their
split unless the task sets ``shared_puzzle_keys``. ``info`` (JSON, e.g. a Sudoku rating or an ARC
augmentation) is stored per puzzle id.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from latentloop.errors import UsageError
from latentloop.io import writing_to
from latentloop.tasks.base import Task

FORMAT = "latentloop-puzzles"
VERSION = 1
SPLITS = ("train", "validation", "test")
ARRAYS = ("inputs", "labels", "puzzle_ids", "groups")
#: Default number of training puzzles for tasks that generate without end (Sudoku).
DEFAULT_ENDLESS_SIZE = 1000


def _records(task: Task, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
    rows = task.records(split, seed, size)
    if task.shared_puzzle_keys:
        return rows
    # Keys are per split unless the task says otherwise (ARC: an evaluation task's demonstrations in train
    # and its test inputs in test are one puzzle).
    return ((x, y, (split, p), (split, g), info) for x, y, p, g, info in rows)


class _Ids:
    """Consecutive integer ids for hashable keys, in order of first appearance."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}

    def __call__(self, key: Any) -> int:
        return self.ids.setdefault(key, len(self.ids))


def _collect(
    rows: Iterable[tuple[Any, ...]], puzzle_ids: _Ids, group_ids: _Ids, info: dict[int, Any], bar: tqdm
) -> dict[str, np.ndarray]:
    inputs, labels, puzzles, groups = [], [], [], []
    seen_puzzles: set[int] = set()
    for x, y, puzzle_key, group_key, extra in rows:
        pid = puzzle_ids(puzzle_key)
        if pid not in seen_puzzles:
            seen_puzzles.add(pid)
            bar.update(1)
        if extra is not None:
            info.setdefault(pid, extra)
        inputs.append(x)
        labels.append(y)
        puzzles.append(pid)
        groups.append(group_ids(group_key))
    if not inputs:
        raise UsageError("the dataset would be empty (check --size and the task options)")
    if len({len(v) for v in inputs + labels}) != 1:
        raise ValueError("a task produced rows of different lengths")  # a bug, not bad input
    return {
        "inputs": np.stack(inputs).astype(np.uint8),
        "labels": np.stack(labels).astype(np.uint8),
        "puzzle_ids": np.asarray(puzzles, dtype=np.int32),
        "groups": np.asarray(groups, dtype=np.int32),
    }


def _hold_out(
    train: dict[str, np.ndarray], groups: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``train`` split into (the rest, its last ``groups`` groups in order of first appearance)."""
    order = list(dict.fromkeys(train["groups"].tolist()))
    if groups >= len(order):
        raise UsageError(
            f"a validation split of {groups} puzzles leaves nothing to train on ({len(order)} in the train split)"
        )
    held = np.isin(train["groups"], order[-groups:])
    return {k: v[~held] for k, v in train.items()}, {k: v[held] for k, v in train.items()}


def _counts(arrays: dict[str, np.ndarray]) -> dict[str, int]:
    return {
        "rows": len(arrays["inputs"]),
        "puzzles": len(np.unique(arrays["puzzle_ids"])),
        "groups": len(np.unique(arrays["groups"])),
    }


def build_dataset(
    task: Task,
    out: str | Path,
    *,
    size: int | None = None,
    test_size: int | None = None,
    seed: int = 0,
    force: bool = False,
    progress: bool | None = None,
    spec: dict[str, Any] | None = None,
    validation: int = 0,
) -> dict[str, Any]:
    """Build ``task``'s train and test splits into folder ``out`` and return the metadata.

    ``size``/``test_size`` cap the puzzles (distinct inputs) per split; tasks that generate without end get
    ``size`` 1000 and ``test_size`` 15/85 of it by default. ``validation`` > 0 moves the last that many
    groups of the training split (an original problem with all its completions and copies) into a
    ``validation`` split, so settings can be tuned on problems the model never trains on while the test split
    stays untouched. The folder appears complete or not at all: it is
    written beside ``out`` and renamed into place (an existing ``out`` is replaced only with ``force``).
    ``progress`` None shows a bar when stderr is a terminal. ``spec`` is recorded in the metadata.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {str(out)!r} exists and is not empty (use --force to replace it)")
    if task.endless:
        size = DEFAULT_ENDLESS_SIZE if size is None else size
        test_size = max(1, math.ceil(size * 15 / 85)) if test_size is None else test_size
    for name, value in (("--size", size), ("--test-size", test_size)):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if validation < 0:
        raise UsageError(f"the validation split must hold at least 0 puzzles, got {validation}")

    puzzle_ids, group_ids = _Ids(), _Ids()
    info: dict[int, Any] = {}
    splits: dict[str, dict[str, np.ndarray]] = {}
    show = sys.stderr.isatty() if progress is None else progress
    for split, cap in (("train", size), ("test", test_size)):
        with tqdm(
            total=cap, desc=f"{task.name} {split}", unit="puzzle", disable=not show, leave=False
        ) as bar:
            splits[split] = _collect(_records(task, split, seed, cap), puzzle_ids, group_ids, info, bar)
    if validation:
        splits["train"], splits["validation"] = _hold_out(splits["train"], validation)
    splits = {name: splits[name] for name in SPLITS if name in splits}

    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "task": task.name,
        "options": spec or {},
        "seed": seed,
        "seq_len": int(splits["train"]["inputs"].shape[1]),
        "vocab_size": int(task.vocab_size) or int(max(a["labels"].max() for a in splits.values())) + 1,
        "pad_id": 0,
        "ignore_label_id": 0,
        "task_info": task.metadata(),
        "counts": {split: _counts(arrays) for split, arrays in splits.items()},
        "num_puzzle_ids": len(puzzle_ids.ids),
        "puzzles": {str(pid): extra for pid, extra in sorted(info.items())},
    }
    _write_folder(out, splits, metadata, force)
    return metadata


def _write_folder(
    out: Path, splits: dict[str, dict[str, np.ndarray]], metadata: dict[str, Any], force: bool
) -> None:
    with writing_to(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temp, 0o777 & ~umask)  # mkdtemp makes it private; the finished folder gets normal permissions
    try:
        for split, arrays in splits.items():
            (temp / split).mkdir()
            for name, array in arrays.items():
                np.save(temp / split / f"{name}.npy", array)
        (temp / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n")
        old = None
        if out.exists():
            if any(out.iterdir()) and not force:
                raise UsageError(f"--out {str(out)!r} appeared while building (use --force to replace it)")
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(temp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)


@dataclass
class PuzzleDataset:
    """A dataset folder opened for reading (arrays are memory-mapped)."""

    path: Path
    metadata: dict[str, Any]

    def split(self, name: str) -> dict[str, np.ndarray]:
        """``{"inputs", "labels", "puzzle_ids", "groups"}`` of split ``name``."""
        if name not in SPLITS:
            raise UsageError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        if name not in self.metadata.get("counts", {}):
            raise UsageError(
                f"dataset {self.path} has no {name} split (a run builds one with train.validation=N)"
            )
        return {a: np.load(self.path / name / f"{a}.npy", mmap_mode="r") for a in ARRAYS}


def load_dataset(path: str | Path) -> PuzzleDataset:
    """Open a dataset folder written by :func:`build_dataset`."""
    path = Path(path)
    try:
        metadata = json.loads((path / "metadata.json").read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{str(path)!r} is not a latentloop dataset folder: {error}") from None
    if metadata.get("format") != FORMAT:
        raise UsageError(f"{str(path)!r} is not a latentloop puzzle dataset")
    return PuzzleDataset(path, metadata)
