"""Dataset folders written by the official TinyRecursiveModels and HRM builders, read as they are.

Their ``dataset/build_sudoku_dataset.py``, ``build_maze_dataset.py`` and ``build_arc_dataset.py`` write::

    DIR/identifiers.json                 the name of each puzzle identifier (id 0 is "<blank>"); ARC names
                                         carry the task and its augmentation
    DIR/train/dataset.json               pad_id, ignore_label_id, blank_identifier_id, vocab_size, seq_len,
                                         num_puzzle_identifiers, total_groups, mean_puzzle_examples,
                                         total_puzzles (TinyRecursiveModels only) and sets
    DIR/train/S__inputs.npy              [examples, seq_len] token ids, for the set S named in "sets" ("all")
    DIR/train/S__labels.npy              [examples, seq_len] token ids; ignore_label_id where nothing is scored
    DIR/train/S__puzzle_identifiers.npy  [puzzles]           the identifier (embedding id) of each puzzle
    DIR/train/S__puzzle_indices.npy      [puzzles + 1]       puzzle p holds examples indices[p]:indices[p + 1]
    DIR/train/S__group_indices.npy       [groups + 1]        group g holds puzzles indices[g]:indices[g + 1]
    DIR/test/...                         the same

A *puzzle* is the examples that share an identifier: one example for Sudoku and mazes (whose identifiers
are all the blank 0), the demonstrations or the test inputs of one ARC task under one augmentation. A
*group* is an original problem with its augmented copies. Tokens, as the builders write them:

- Sudoku: 0 pad, ``1 + d`` for digit ``d`` (so 1 is a blank); vocab_size 11, seq_len 81.
- Maze: 0 pad, ``1 + i`` for character ``i`` of ``"# SGo"``; vocab_size 6, seq_len 900.
- ARC: 0 pad, 1 the end marker right of and below the grid, ``2 + c`` for colour ``c``, in a 30x30 frame;
  vocab_size 12, seq_len 900.

These are the token ids of latentloop's sudoku, maze and ARC tasks too, so rows are used without
translation; a task states its ``seq_len`` and ``vocab_size`` and a folder that disagrees is refused.
:func:`open_official` checks a folder (one :class:`UsageError` line naming the missing or inconsistent file or
field) and memory-maps the token arrays; :meth:`OfficialDataset.puzzle_dataset` gives the split arrays in
the shape the trainer and the evaluators read (:class:`~latentloop.data.dataset.PuzzleDataset`), the tokens
still on disk.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from latentloop.data.dataset import PuzzleDataset
from latentloop.errors import UsageError

FORMAT = "official"
SPLITS = ("train", "test")
ARRAYS = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
#: The fields of dataset.json (the builders' ``PuzzleDatasetMetadata``) and their JSON types; HRM's builders
#: write no total_puzzles, and ignore_label_id may be null.
FIELDS: dict[str, tuple[type, ...]] = {
    "pad_id": (int,),
    "ignore_label_id": (int, type(None)),
    "blank_identifier_id": (int,),
    "vocab_size": (int,),
    "seq_len": (int,),
    "num_puzzle_identifiers": (int,),
    "total_groups": (int,),
    "mean_puzzle_examples": (int, float),
    "sets": (list,),
}
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {"total_puzzles": (int,)}
#: The official dihedral transform ids (``dataset/common.py``: identity, three rotations, left-right flip,
#: up-down flip, transpose, anti-transpose) as indices of :func:`latentloop.data.augment.dihedral`.
OFFICIAL_DIHEDRAL = (0, 1, 2, 3, 7, 5, 4, 6)


class OfficialRow(NamedTuple):
    """One example of a split: its tokens, the index of its puzzle and group, and the puzzle's identifier."""

    inputs: np.ndarray
    labels: np.ndarray
    puzzle: int
    identifier: int
    group: int


@dataclass
class OfficialSplit:
    """One split (``train`` or ``test``) of an official folder: token arrays memory-mapped, indices in memory."""

    name: str
    folder: Path
    metadata: dict[str, Any]
    inputs: np.ndarray
    labels: np.ndarray
    puzzle_identifiers: np.ndarray
    puzzle_indices: np.ndarray
    group_indices: np.ndarray

    @property
    def groups(self) -> int:
        """How many groups (original problems) the split holds."""
        return len(self.group_indices) - 1

    def bounds(self, first: int, stop: int) -> tuple[int, int, int, int]:
        """``(first puzzle, stop puzzle, first row, stop row)`` of groups ``first:stop``."""
        p0, p1 = int(self.group_indices[first]), int(self.group_indices[stop])
        return p0, p1, int(self.puzzle_indices[p0]), int(self.puzzle_indices[p1])

    def row_puzzles(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """The puzzle index of every row of groups ``first:stop``."""
        p0, p1, _, _ = self.bounds(first, self.groups if stop is None else stop)
        return np.repeat(np.arange(p0, p1, dtype=np.int32), np.diff(self.puzzle_indices[p0 : p1 + 1]))

    def row_groups(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """The group index of every row of groups ``first:stop``."""
        stop = self.groups if stop is None else stop
        puzzle_groups = np.repeat(
            np.arange(first, stop, dtype=np.int32), np.diff(self.group_indices[first : stop + 1])
        )
        p0 = int(self.group_indices[first])
        return puzzle_groups[self.row_puzzles(first, stop) - p0]

    def rows(self, first: int = 0, stop: int | None = None, chunk: int = 4096) -> Iterator[OfficialRow]:
        """Every example of groups ``first:stop`` in order, read from the memory maps ``chunk`` rows at a time."""
        stop = self.groups if stop is None else stop
        _, _, r0, r1 = self.bounds(first, stop)
        puzzles, groups = self.row_puzzles(first, stop), self.row_groups(first, stop)
        for start in range(r0, r1, chunk):
            end = min(start + chunk, r1)
            inputs, labels = np.asarray(self.inputs[start:end]), np.asarray(self.labels[start:end])
            for i in range(end - start):
                puzzle = int(puzzles[start - r0 + i])
                yield OfficialRow(
                    inputs[i],
                    labels[i],
                    puzzle,
                    int(self.puzzle_identifiers[puzzle]),
                    int(groups[start - r0 + i]),
                )


@dataclass
class OfficialPuzzleDataset(PuzzleDataset):
    """An official folder in the shape of a latentloop dataset: :meth:`split` gives ``inputs`` and ``labels``
    (memory maps of the official arrays, sliced to the split's rows), ``puzzle_ids`` and ``groups`` per row."""

    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def split(self, name: str) -> dict[str, np.ndarray]:
        """``{"inputs", "labels", "puzzle_ids", "groups"}`` of split ``name``."""
        if name not in self.arrays:
            raise UsageError(
                f"the official dataset {self.path} has no {name} split"
                + (" (a run holds one out with train.validation=N)" if name == "validation" else "")
            )
        return dict(self.arrays[name])


@dataclass
class OfficialDataset:
    """An official folder, checked and opened (see :func:`open_official`)."""

    path: Path
    task: str
    splits: dict[str, OfficialSplit]
    #: Rows' puzzle ids are the official identifiers (a learned embedding each, ARC); otherwise each puzzle's
    #: index in its split, so that distinct inputs keep distinct ids (Sudoku and mazes share the blank 0).
    embeddings: bool = False
    identifiers: list[str] | None = None
    describe: Callable[[str], dict[str, Any] | None] | None = None

    def puzzle_info(self) -> dict[str, Any]:
        """Per identifier (as a string) what ``describe`` makes of its name in identifiers.json (ARC: task and
        augmentation); empty without ``describe``."""
        if self.describe is None or self.identifiers is None:
            return {}
        used = np.unique(np.concatenate([s.puzzle_identifiers for s in self.splits.values()]))
        info = {}
        for identifier in used.tolist():
            described = self.describe(self.identifiers[identifier])
            if described is not None:
                info[str(identifier)] = described
        return info

    def puzzle_dataset(
        self, size: int | None = None, test_size: int | None = None, validation: int = 0
    ) -> OfficialPuzzleDataset:
        """The splits as the trainer reads them: the first ``size`` groups of train and ``test_size`` of test
        (all by default), and with ``validation`` > 0 the last that many training groups apart as a
        ``validation`` split. Groups are runs of consecutive rows, so every split is a slice of the memory
        maps and nothing of the token arrays is read here."""
        for name, value in (("train.train_size", size), ("train.test_size", test_size)):
            if value is not None and value < 1:
                raise UsageError(f"{name} must be at least 1, got {value}")
        train, test = self.splits["train"], self.splits["test"]
        kept = min(train.groups, size) if size is not None else train.groups
        if validation >= kept:
            raise UsageError(
                f"train.validation={validation} holds out every training group, leaving nothing to train on "
                f"({kept} groups in {train.folder})"
            )
        ranges = {"train": (train, 0, kept - validation)}
        if validation:
            ranges["validation"] = (train, kept - validation, kept)
        ranges["test"] = (test, 0, min(test.groups, test_size) if test_size is not None else test.groups)
        arrays, counts = {}, {}
        for name, (split, first, stop) in ranges.items():
            arrays[name] = self._arrays(split, first, stop)
            p0, p1, r0, r1 = split.bounds(first, stop)
            counts[name] = {"rows": r1 - r0, "puzzles": p1 - p0, "groups": stop - first}
        meta = train.metadata
        metadata = {
            "format": FORMAT,
            "source": str(self.path),
            "task": self.task,
            "seq_len": meta["seq_len"],
            "vocab_size": meta["vocab_size"],
            "pad_id": 0,
            "ignore_label_id": 0,
            "counts": counts,
            "num_puzzle_ids": int(meta["num_puzzle_identifiers"]),
            "puzzles": self.puzzle_info(),
        }
        return OfficialPuzzleDataset(self.path, metadata, arrays)

    def _arrays(self, split: OfficialSplit, first: int, stop: int) -> dict[str, np.ndarray]:
        _, _, r0, r1 = split.bounds(first, stop)
        puzzles = split.row_puzzles(first, stop)
        # The per-row ids are built in memory: 4 bytes a row beside the 2 x seq_len bytes of its tokens, which
        # stay on disk; evaluation and the puzzle-embedding count read them whole.
        ids = split.puzzle_identifiers[puzzles].astype(np.int32) if self.embeddings else puzzles
        return {
            "inputs": split.inputs[r0:r1],
            "labels": split.labels[r0:r1],
            "puzzle_ids": ids,
            "groups": split.row_groups(first, stop),
        }


def _read_metadata(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise UsageError(
            f"{file} is missing (an official dataset folder has train/ and test/ with dataset.json)"
        )
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{file} is not readable JSON: {error}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{file} must hold a JSON object, got {type(meta).__name__}")
    for name, types in {**FIELDS, **OPTIONAL_FIELDS}.items():
        if name not in meta:
            if name in FIELDS:
                raise UsageError(f"{file} has no field {name!r}")
            continue
        value = meta[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise UsageError(f"{file}: field {name!r} has the wrong type ({value!r})")
    for name in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
        if meta[name] < 1:
            raise UsageError(f"{file}: field {name!r} must be at least 1, got {meta[name]}")
    sets = meta["sets"]
    if not sets or not all(isinstance(s, str) and s for s in sets):
        raise UsageError(f"{file}: field 'sets' must list set names, got {sets!r}")
    if len(sets) > 1:
        # The builders write one set, "all"; several would have to be concatenated, i.e. read into memory.
        raise UsageError(
            f"{file} lists {len(sets)} sets {sets}; latentloop reads folders of one set per split"
        )
    return meta


def _load_array(file: Path, ndim: int) -> np.ndarray:
    if not file.is_file():
        raise UsageError(f"{file} is missing")
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"{file} is not a readable .npy array: {error}") from None
    if not np.issubdtype(array.dtype, np.integer):
        raise UsageError(f"{file} holds {array.dtype} values, not integers")
    if array.ndim != ndim:
        raise UsageError(f"{file} has {array.ndim} dimensions, expected {ndim}")
    return array


def _check_indices(file: Path, indices: np.ndarray, end: int, what: str) -> None:
    if len(indices) < 1 or indices[0] != 0:
        raise UsageError(f"{file} must start at 0")
    if np.any(np.diff(indices) < 0):
        step = int(np.argmax(np.diff(indices) < 0))
        raise UsageError(f"{file} is not monotone: entry {step + 1} ({indices[step + 1]}) < {indices[step]}")
    if indices[-1] != end:
        raise UsageError(f"{file} ends at {indices[-1]}, but the split has {end} {what}")


def _open_split(path: Path, name: str) -> OfficialSplit:
    folder = path / name
    meta = _read_metadata(folder / "dataset.json")
    prefix = meta["sets"][0]
    inputs = _load_array(folder / f"{prefix}__inputs.npy", 2)
    labels = _load_array(folder / f"{prefix}__labels.npy", 2)
    # The index arrays are small (one entry per puzzle or group) and read whole, as the official loader does.
    index = {a: np.asarray(_load_array(folder / f"{prefix}__{a}.npy", 1)) for a in ARRAYS[2:]}
    file = {a: folder / f"{prefix}__{a}.npy" for a in ARRAYS}
    if labels.shape != inputs.shape:
        raise UsageError(
            f"{file['labels']} has shape {labels.shape}, {file['inputs'].name} has {inputs.shape}: they must match"
        )
    if inputs.shape[1] != meta["seq_len"]:
        raise UsageError(
            f"{file['inputs']} rows hold {inputs.shape[1]} tokens, {folder / 'dataset.json'} says seq_len "
            f"{meta['seq_len']}"
        )
    if len(inputs) == 0:
        raise UsageError(f"{file['inputs']} holds no examples")
    puzzles = len(index["puzzle_identifiers"])
    if len(index["puzzle_indices"]) != puzzles + 1:
        raise UsageError(
            f"{file['puzzle_indices']} has {len(index['puzzle_indices'])} entries, {file['puzzle_identifiers'].name} "
            f"names {puzzles} puzzles (there must be one index more than puzzles)"
        )
    _check_indices(file["puzzle_indices"], index["puzzle_indices"], len(inputs), "examples")
    _check_indices(file["group_indices"], index["group_indices"], puzzles, "puzzles")
    groups = len(index["group_indices"]) - 1
    if meta["total_groups"] != groups:
        raise UsageError(
            f"{folder / 'dataset.json'} says total_groups {meta['total_groups']}, {file['group_indices'].name} "
            f"holds {groups} groups"
        )
    ids = index["puzzle_identifiers"]
    if len(ids) and (ids.min() < 0 or ids.max() >= meta["num_puzzle_identifiers"]):
        raise UsageError(
            f"{file['puzzle_identifiers']} holds identifiers {ids.min()}..{ids.max()}, {folder / 'dataset.json'} "
            f"says num_puzzle_identifiers {meta['num_puzzle_identifiers']}"
        )
    return OfficialSplit(name, folder, meta, inputs, labels, **index)


def _read_identifiers(path: Path, count: int) -> list[str]:
    file = path / "identifiers.json"
    if not file.is_file():
        raise UsageError(f"{file} is missing (the official ARC builder writes it beside train/ and test/)")
    try:
        names = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{file} is not readable JSON: {error}") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UsageError(f"{file} must be a JSON list of identifier names")
    if len(names) < count:
        raise UsageError(
            f"{file} names {len(names)} identifiers, dataset.json says num_puzzle_identifiers {count}"
        )
    return names


def looks_official(path: str | Path) -> bool:
    """Whether ``path`` is a folder to read as an official dataset: a folder that is neither a latentloop
    dataset (``metadata.json``) nor a folder of CSV files (``train.csv``/``test.csv``). A folder that merely
    lacks pieces counts, so that :func:`open_official` names what is missing."""
    path = Path(path)
    if not path.is_dir():
        return False
    return not any((path / name).exists() for name in ("metadata.json", "train.csv", "test.csv"))


def open_official(
    path: str | Path,
    *,
    task: str,
    seq_len: int,
    vocab_size: int,
    embeddings: bool = False,
    describe: Callable[[str], dict[str, Any] | None] | None = None,
) -> OfficialDataset:
    """Check the official folder ``path`` for task ``task`` (rows of ``seq_len`` tokens below ``vocab_size``)
    and open it; a missing or inconsistent file or field is a :class:`UsageError` naming it.

    ``embeddings``: rows' puzzle ids are the official identifiers (the task learns an embedding per puzzle).
    ``describe`` turns an identifier's name in ``identifiers.json`` (then required) into the per-puzzle info
    that the task's evaluation reads, or None."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{str(path)!r} is not a folder (an official dataset folder has train/ and test/)")
    if (path / "metadata.json").is_file():
        raise UsageError(f"{path} is a latentloop dataset folder, not an official one: give it as train.data")
    splits = {name: _open_split(path, name) for name in SPLITS}
    for split in splits.values():
        meta, where = split.metadata, split.folder / "dataset.json"
        if meta["seq_len"] != seq_len or meta["vocab_size"] != vocab_size:
            raise UsageError(
                f"{where} holds rows of {meta['seq_len']} tokens over a vocabulary of {meta['vocab_size']}; task "
                f"{task!r} has {seq_len} tokens over {vocab_size}"
            )
        if meta["pad_id"] != 0 or meta["ignore_label_id"] not in (0, None):
            raise UsageError(
                f"{where}: pad_id {meta['pad_id']} and ignore_label_id {meta['ignore_label_id']}; latentloop reads "
                "pad and unscored labels as 0, as the official builders write them"
            )
    train, test = splits["train"].metadata, splits["test"].metadata
    if train["num_puzzle_identifiers"] != test["num_puzzle_identifiers"]:
        raise UsageError(
            f"{path}: train/ and test/ disagree on num_puzzle_identifiers ({train['num_puzzle_identifiers']} and "
            f"{test['num_puzzle_identifiers']}); identifiers are shared across the splits"
        )
    identifiers = None
    if describe is not None:
        identifiers = _read_identifiers(path, train["num_puzzle_identifiers"])
    return OfficialDataset(path, task, splits, embeddings, identifiers, describe)
