"""The puzzle reasoners' training data: the task's train/test arrays (built once into ``OUT/data``) and the
batch of each step, a pure function of ``(seed, step)``, augmented on the fly where the task allows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from latentloop.data.dataset import SPLITS, build_dataset, load_dataset
from latentloop.data.labels import scored_labels
from latentloop.errors import UsageError
from latentloop.models.reasoners import ReasonerConfig
from latentloop.tasks.base import Task
from latentloop.train.run_config import ReasonerRunConfig


def task_data(config: ReasonerRunConfig, task: Task, out: Path) -> dict[str, dict[str, np.ndarray]]:
    """The train/test (and validation, with ``train.validation``) arrays of ``task``: the official dataset
    folder the task reads as it is (its ``data`` option, see :meth:`Task.official_dataset`; inputs and labels
    stay memory-mapped), else ``train.data`` if given, else built once into ``OUT/data``."""
    tc = config.train
    official = task.official_dataset()
    if official is not None:
        if tc.data:
            raise UsageError(
                f"task.data names an official dataset folder ({official.path}); train.data cannot be given too"
            )
        opened = official.puzzle_dataset(tc.train_size, tc.test_size, tc.validation)
        return {s: opened.split(s) for s in SPLITS if s in opened.metadata["counts"]}
    folder = Path(tc.data) if tc.data else out / "data"
    if not tc.data and not (folder / "metadata.json").is_file():
        build_dataset(
            task,
            folder,
            size=tc.train_size,
            test_size=tc.test_size,
            seed=tc.seed if tc.data_seed is None else tc.data_seed,
            progress=False,
            validation=tc.validation,
        )
    dataset = load_dataset(folder)
    meta = dataset.metadata
    if meta.get("task") != task.name or int(meta.get("seq_len", -1)) != task.seq_len:
        raise UsageError(
            f"dataset {folder} holds {meta.get('task')!r} with seq_len {meta.get('seq_len')}, "
            f"the config asks for {task.name!r} with seq_len {task.seq_len}"
        )
    held = meta["counts"].get("validation", {}).get("groups", 0)
    if held != tc.validation:
        raise UsageError(
            f"dataset {folder} holds {held} validation puzzles, the config asks for train.validation="
            f"{tc.validation}"
        )
    return {s: {k: np.asarray(v) for k, v in dataset.split(s).items()} for s in SPLITS if s in meta["counts"]}


def train_batch(
    task: Task, split: dict[str, np.ndarray], step: int, batch_size: int, seed: int, augment: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(inputs, labels, puzzle_ids)`` of batch ``step``: rows drawn with replacement by a generator seeded
    with ``(seed, step)``, then the task's validity-preserving transform of each row (:meth:`Task.augment`:
    N-Queens the 8 symmetries of the board, Sudoku digit, band and stack shuffles; none for graph colouring,
    whose labels are canonical colourings, nor for ARC, whose augmented copies are rows of the dataset)."""
    return draw_examples(task, split, np.random.default_rng([seed, step]), batch_size, augment)


def draw_examples(
    task: Task, split: dict[str, np.ndarray], rng: np.random.Generator, count: int, augment: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` rows of ``split`` drawn with replacement by ``rng``, augmented (see :func:`train_batch`); the
    labels mark unscored positions with :data:`~latentloop.data.labels.IGNORE_LABEL`."""
    rows = rng.integers(0, len(split["inputs"]), count)
    x, y = split["inputs"][rows].copy(), split["labels"][rows].copy()
    if augment:
        task.augment(x, y, rng)
    puzzle_ids = np.asarray(split["puzzle_ids"])[rows].astype(np.int64)
    return (
        torch.from_numpy(x.astype(np.int64)),
        torch.from_numpy(scored_labels(y)),
        torch.from_numpy(puzzle_ids),
    )


def fit_puzzle_embeddings(config: ReasonerConfig, task: Task, data: dict[str, dict[str, np.ndarray]]) -> None:
    """Give ``config`` one puzzle embedding per puzzle id of the dataset when the task needs them (ARC)."""
    if not task.puzzle_embeddings:
        return
    needed = 1 + max(int(np.max(split["puzzle_ids"], initial=-1)) for split in data.values())
    if config.puzzles and config.puzzles < needed:
        raise UsageError(f"model.puzzles={config.puzzles} is too few: the dataset has {needed} puzzle ids")
    config.puzzles = config.puzzles or needed
