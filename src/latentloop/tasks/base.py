"""The task interface: how to make or load examples, encode them as tokens, and verify an answer.

Everything the rest of the package asks of a task is declared on :class:`Task` with a default, so callers
never test a task's name or probe for attributes: a capability is a flag (``multi_solution``,
``puzzle_embeddings``...) or a method whose default does nothing or says clearly that the task lacks it.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from latentloop.errors import UsageError

if TYPE_CHECKING:
    import torch

    from latentloop.data.official import OfficialDataset


class ExactSolution(NamedTuple):
    """What an exact solver found, in the form ``latentloop solve --exact`` reports it."""

    payload: dict[str, Any]  # the ``--json`` output
    text: str  # the output for a reader
    solved: bool  # False when there is no solution or the search gave up (exit status 1)


class Task(ABC):
    """A family of problems. Accuracy is always decided by :meth:`verify`, never by comparing to one label."""

    name: str = ""
    #: Tokens per input (and label) row; set by each task from its options (0 until then).
    seq_len: int = 0
    #: Token ids run from 0 to ``vocab_size - 1``; 0 leaves a dataset to count them from its labels.
    vocab_size: int = 0

    # -- what the task is ------------------------------------------------------------------------------------
    #: Puzzles usually have several valid answers: evaluation reports coverage (distinct valid answers found
    #: among the samples over all valid answers, from :meth:`solutions`).
    multi_solution: bool = False
    #: Evaluation reports the chosen answers' violations as conflicts (graph colouring's clashing edges).
    reports_conflicts: bool = False
    #: A reasoner needs a learned embedding per puzzle id to solve the task (ARC: the rule is in the
    #: demonstrations, not in the test input); answers are then judged against the labels, not the verifier.
    puzzle_embeddings: bool = False
    #: Dataset puzzle and group keys are shared across splits instead of scoped to each (ARC).
    shared_puzzle_keys: bool = False
    #: :meth:`examples` never ends (generated puzzles): a dataset then needs a size, 1000 by default.
    endless: bool = False
    #: :meth:`blank` states the all-unknown puzzle that unconditional generation answers.
    has_blank: bool = False
    #: Answers are binary images (:meth:`images` gives the real ones): unconditional samples are drawn as a
    #: picture and scored against the real held-out images.
    image_answers: bool = False
    #: :meth:`draw` can draw an answer.
    drawable: bool = False
    #: :meth:`nearest_completion` lists every valid answer of a puzzle and picks the likeliest
    #: (``train.nearest_target``).
    lists_completions: bool = False
    #: :meth:`train_batch` and :meth:`heldout_batches` feed the recurrent-depth language model.
    trains_language_model: bool = False
    #: :meth:`label_work` counts the sequential steps each training label needs (``train.work_per_iteration``).
    counts_label_work: bool = False
    #: What the language model's held-out evaluation reports ("exact_match" or "perplexity"); None for the
    #: tasks that train no language model.
    metric: str | None = None

    @abstractmethod
    def examples(self, split: str, seed: int = 0) -> Iterable[tuple[Any, Any]]:
        """Pairs ``(input, target)`` of ``split`` ("train" or "test"), generated or loaded, deterministic in ``seed``."""

    @abstractmethod
    def encode(self, puzzle: Any) -> Any:
        """Token ids of a puzzle or answer."""

    @abstractmethod
    def decode(self, tokens: Any) -> Any:
        """The puzzle or answer that token ids stand for."""

    @abstractmethod
    def verify(self, puzzle: Any, answer: Any) -> bool:
        """True when ``answer`` satisfies every constraint of ``puzzle`` and keeps its givens."""

    def violations(self, puzzle: Any, answer: Any) -> int:
        """How many constraints ``answer`` breaks (0 exactly when it is valid)."""
        return 0 if self.verify(puzzle, answer) else 1

    def solutions(self, puzzle: Any, limit: int | None = None) -> list[Any]:
        """All valid answers of ``puzzle`` (at most ``limit``), where exact enumeration is feasible."""
        raise NotImplementedError(f"task {self.name!r} cannot enumerate solutions")

    def parse(self, text: str) -> Any:
        """A puzzle or answer from its human text form; raises :class:`UsageError` with a clear message."""
        raise NotImplementedError(f"task {self.name!r} has no text form")

    def parse_answer(self, text: str, puzzle: Any = None) -> Any:
        """An answer to ``puzzle`` from its text form. Default: :meth:`parse`; tasks whose answers read
        differently from puzzles (an invalid answer is still readable, a colouring is not a graph) override
        it."""
        return self.parse(text)

    def format(self, answer: Any, pretty: bool = False) -> str:
        """The text form of a puzzle or answer, which :meth:`parse` reads back; ``pretty`` asks for the form
        drawn for a reader (a grid on several lines) where the task has one."""
        return str(answer)

    def draw(self, ax: Any, puzzle: Any, answer: Any) -> None:
        """Draw ``answer`` to ``puzzle`` on the matplotlib axes ``ax``: the givens apart from what was filled
        in, and the broken constraints marked (tasks with ``drawable = True``)."""
        raise NotImplementedError(f"task {self.name!r} cannot draw its answers")

    # -- answers as a model predicts them --------------------------------------------------------------------
    def decode_answer(self, tokens: Any) -> Any:
        """The answer that a model's predicted ``tokens`` stand for. Default: :meth:`decode`; a task whose
        rows hold more than the answer reads only the answer's positions."""
        return self.decode(tokens)

    def answer_key(self, answer: Any) -> Hashable:
        """A hashable identity of ``answer``: answers that count as the same one (for votes and coverage)
        share it. Default: the bytes of the answer as an array."""
        return np.asarray(answer).tobytes()

    def augment(self, inputs: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> None:
        """Transform a training batch of token rows ``inputs`` and ``labels`` ``[B, L]`` **in place** by a
        random symmetry per row that keeps every answer valid, drawing from ``rng``. Default: no transform
        (and no draw), for tasks whose labels a symmetry would make non-canonical or whose augmented copies
        are rows of the dataset (ARC)."""
        return None

    # -- datasets --------------------------------------------------------------------------------------------
    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows ``(inputs, labels, puzzle_key, group_key, info)`` of ``split`` for at most ``size``
        puzzles (distinct inputs); ``info`` is JSON stored per puzzle, or None. Default: one row per example
        of :meth:`examples`, rows with the same input sharing one puzzle and group key."""
        count = 0
        seen: set[bytes] = set()
        for x, y in self.examples(split, seed):
            inputs = np.asarray(self.encode(x))
            key = inputs.tobytes()
            if key not in seen:
                if size is not None and count >= size:
                    return
                seen.add(key)
                count += 1
            yield inputs, np.asarray(self.encode(y)), key, key, None

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task (options, token ids). Default: nothing."""
        return {}

    def official_dataset(self) -> OfficialDataset | None:
        """The official TinyRecursiveModels/HRM dataset folder that the task's options name (its ``data``),
        checked and opened (:func:`latentloop.data.official.open_official`): training and evaluation then read
        it as it is instead of building a dataset. Default: None."""
        return None

    # -- solving without a model -----------------------------------------------------------------------------
    def solve_exact(self, puzzle: Any, list_all: bool = False, limit: int | None = None) -> ExactSolution:
        """Solve ``puzzle`` with the task's classical exact solver: one solution (and whether it is unique),
        or with ``list_all`` every one of them (at most ``limit``). Default: the task has none."""
        raise UsageError(f"task {self.name!r} has no exact solver (it is solved with --model)")

    def nearest_completion(self, inputs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The label tokens ``[B, L]`` of each puzzle's valid answer that is likeliest under ``logits``
        ``[B, L, V]`` (the sum of its tokens' log-probabilities), among the answers that keep the givens of
        ``inputs`` ``[B, L]``; only where :attr:`lists_completions`."""
        raise UsageError(f"task {self.name!r} cannot list the valid answers of its puzzles")

    # -- unconditional generation ----------------------------------------------------------------------------
    def blank(self) -> Any:
        """The all-unknown puzzle whose valid answers are the task's unconditional samples (``has_blank``)."""
        raise UsageError(f"task {self.name!r} has no blank puzzle to sample from (try digits or sudoku)")

    def images(self, split: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The real binary images ``[N, H, W]`` of ``split`` and their labels (``image_answers``)."""
        raise UsageError(f"task {self.name!r} has no images")

    # -- the recurrent-depth language model ------------------------------------------------------------------
    def train_batch(self, step: int, batch_size: int, seed: int = 0) -> tuple[Any, Any]:
        """``(input_ids, labels)`` of training step ``step``, a pure function of ``(seed, step)``
        (``trains_language_model``)."""
        raise UsageError(f"task {self.name!r} cannot train a language model")

    def heldout_batches(self, batch_size: int, limit: int | None = None) -> Iterator[tuple[Any, Any, Any]]:
        """The held-out split as ``(input_ids, labels, problems)`` batches, at most ``limit`` problems
        (``trains_language_model``)."""
        raise UsageError(f"task {self.name!r} cannot train a language model")

    def prefix_labels_of(self, problems: list[Any], labels: torch.Tensor) -> torch.Tensor | None:
        """``labels`` [B, T] of the held-out ``problems`` with the intermediate result that training labels each
        prompt position with laid over them, or None when training labels the answer only. Default: None."""
        return None

    def label_work(self, input_ids: torch.Tensor) -> torch.Tensor:
        """For a training batch's ``input_ids`` [B, T], the number of sequential steps (the task's own unit,
        such as letters composed) that the label at each position needs, as an int tensor [B, T]
        (``counts_label_work``)."""
        raise UsageError(f"task {self.name!r} does not count the work of its labels")


# name -> "module:Class"; modules are imported on first use so the command line starts fast.
TASKS: dict[str, str] = {
    "arithmetic": "latentloop.tasks.arithmetic:ArithmeticTask",
    "chains": "latentloop.tasks.chains:ChainsTask",
    "permutations": "latentloop.tasks.permutations:PermutationsTask",
    "text": "latentloop.tasks.text:TextTask",
    "sudoku": "latentloop.tasks.sudoku:SudokuTask",
    "nqueens": "latentloop.tasks.nqueens:NQueensTask",
    "graph-coloring": "latentloop.tasks.graph_coloring:GraphColoringTask",
    "arc-agi-1": "latentloop.tasks.arc:ArcAgi1Task",
    "arc-agi-2": "latentloop.tasks.arc:ArcAgi2Task",
    "digits": "latentloop.tasks.digits:DigitsTask",
    "maze": "latentloop.tasks.maze:MazeTask",
}


def register_task(name: str, target: str) -> None:
    """Make ``target`` (``"package.module:Class"``, a :class:`Task` subclass) available as task ``name`` to every
    command and config; the module is imported on first use."""
    if ":" not in target:
        raise ValueError(f"a task is registered as 'module:Class', got {target!r}")
    TASKS[name] = target


def task_class(name: str) -> type[Task]:
    """The class registered under ``name``."""
    if name not in TASKS:
        raise UsageError(f"unknown task {name!r} (known: {', '.join(sorted(TASKS))})")
    module, _, cls = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def get_task(name: str, **options: Any) -> Task:
    """The task ``name`` with ``options`` (e.g. ``get_task("nqueens", n=8)``); unknown options are an error."""
    cls = task_class(name)
    try:
        return cls(**options)
    except TypeError as error:
        raise UsageError(f"task {name!r}: {error}") from None


def format_task_spec(name: str, options: dict[str, Any]) -> str:
    """The spec that :func:`parse_task_spec` reads back to ``name`` and ``options``: ``name:key=value,...``, a
    list's items joined by ``;`` (``k=[7, 8, 9]`` -> ``k=7;8;9``), since ``,`` separates the options."""
    items = [
        f"{key}={';'.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"
        for key, value in options.items()
    ]
    return f"{name}:{','.join(items)}" if items else name


def parse_task_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"nqueens:n=8,k=5"`` -> ``("nqueens", {"n": "8", "k": "5"})`` (values stay strings for the task to parse)."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"task option {item!r} is not of the form key=value")
        options[key.strip().replace("-", "_")] = value.strip()
    return name.strip(), options
