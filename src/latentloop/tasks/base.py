"""The task interface: how to make or load examples, encode them as tokens, and verify an answer."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from latentloop.errors import UsageError


class Task(ABC):
    """A family of problems. Accuracy is always decided by :meth:`verify`, never by comparing to one label."""

    name: str = ""

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

    def format(self, answer: Any, pretty: bool = False) -> str:
        """The text form of a puzzle or answer, which :meth:`parse` reads back; ``pretty`` asks for the form
        drawn for a reader (a grid on several lines) where the task has one."""
        return str(answer)

    drawable: bool = False

    def draw(self, ax: Any, puzzle: Any, answer: Any) -> None:
        """Draw ``answer`` to ``puzzle`` on the matplotlib axes ``ax``: the givens apart from what was filled
        in, and the broken constraints marked (tasks with ``drawable = True``)."""
        raise NotImplementedError(f"task {self.name!r} cannot draw its answers")


# name -> "module:Class"; modules are imported on first use so the command line starts fast.
TASKS: dict[str, str] = {
    "arithmetic": "latentloop.tasks.arithmetic:ArithmeticTask",
    "text": "latentloop.tasks.text:TextTask",
    "sudoku": "latentloop.tasks.sudoku:SudokuTask",
    "nqueens": "latentloop.tasks.nqueens:NQueensTask",
    "graph-coloring": "latentloop.tasks.graph_coloring:GraphColoringTask",
    "arc-agi-1": "latentloop.tasks.arc:ArcAgi1Task",
    "arc-agi-2": "latentloop.tasks.arc:ArcAgi2Task",
    "digits": "latentloop.tasks.digits:DigitsTask",
}


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
