"""The declared extension points of :class:`Task`: their defaults, and the tasks that implement them."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latentloop.errors import UsageError
from latentloop.tasks.base import TASKS, Task, get_task, task_class
from latentloop.tasks.graph_coloring import Graph
from latentloop.tasks.nqueens import all_solutions, board_from_columns

SETTINGS = settings(max_examples=30, deadline=None)


class _Parity(Task):
    """A task with nothing but the abstract methods: every capability keeps its default."""

    name = "parity"

    def examples(self, split, seed=0):
        return iter([((1, 0), (1,)), ((1, 0), (1,)), ((1, 1), (0,)), ((0, 1), (1,))])

    def encode(self, puzzle):
        return np.asarray(puzzle, dtype=np.uint8) + 1

    def decode(self, tokens):
        return tuple(int(t) - 1 for t in tokens)

    def verify(self, puzzle, answer):
        return answer == (sum(puzzle) % 2,)

    def parse(self, text):
        return tuple(int(c) for c in text)


def test_defaults_of_a_task_that_declares_nothing() -> None:
    task = _Parity()
    flags = (
        "multi_solution",
        "reports_conflicts",
        "puzzle_embeddings",
        "shared_puzzle_keys",
        "endless",
        "has_blank",
        "image_answers",
        "drawable",
        "trains_language_model",
        "lists_completions",
    )
    assert not any(getattr(task, flag) for flag in flags)
    assert (task.seq_len, task.vocab_size, task.metric) == (0, 0, None)
    assert task.decode_answer(np.array([2, 1])) == task.decode(np.array([2, 1])) == (1, 0)
    assert task.answer_key(np.array([3, 4], dtype=np.uint8)) == b"\x03\x04"
    assert task.parse_answer("10", puzzle=(1, 1)) == (1, 0)
    assert task.metadata() == {}
    for call in (
        lambda: task.solve_exact((1, 0)),
        lambda: task.blank(),
        lambda: task.images("train"),
        lambda: task.train_batch(0, 4),
        lambda: task.heldout_batches(4),
        lambda: task.nearest_completion(None, None),
    ):
        with pytest.raises(UsageError, match="'parity'"):
            call()


def test_default_records_give_one_puzzle_per_distinct_input() -> None:
    rows = list(_Parity().records("train", 0, None))
    assert len(rows) == 4  # every example is a row; the repeated input shares its puzzle key
    assert [r[2] for r in rows] == [r[3] for r in rows]
    assert rows[0][2] == rows[1][2] != rows[2][2]
    assert all(r[4] is None for r in rows)
    assert len(list(_Parity().records("train", 0, 2))) == 3  # two puzzles, the first of them twice


def test_default_augment_leaves_the_batch_and_the_generator_alone() -> None:
    inputs, labels = np.ones((3, 2), np.uint8), np.full((3, 1), 2, np.uint8)
    rng = np.random.default_rng(0)
    _Parity().augment(inputs, labels, rng)
    assert (inputs == 1).all() and (labels == 2).all()
    assert rng.integers(1 << 30) == np.random.default_rng(0).integers(1 << 30)


def test_an_exact_solver_is_declared_only_where_there_is_one() -> None:
    for name in ("digits", "arithmetic", "chains", "permutations", "text"):
        with pytest.raises(
            UsageError, match=rf"task '{name}' has no exact solver \(it is solved with --model\)"
        ):
            get_task(name).solve_exact(None)
    payload, text, solved = get_task("nqueens", n=4).solve_exact(np.zeros((4, 4), bool), list_all=True)
    assert solved and payload["count"] == 2 and text.endswith("count: 2")
    payload, _, solved = get_task("graph-coloring", n=3, colors=2).solve_exact(
        Graph.from_edges(3, [(0, 1), (1, 2), (0, 2)])
    )
    assert not solved and payload["colorable"] is False
    payload, _, solved = get_task("sudoku", n=4).solve_exact(np.zeros((4, 4), np.int8))
    assert solved and payload["count"] == 2 and not payload["unique"]


def test_the_declared_capabilities_of_each_task() -> None:
    declared = {
        name: {
            flag
            for flag in (
                "multi_solution",
                "reports_conflicts",
                "puzzle_embeddings",
                "has_blank",
                "image_answers",
                "lists_completions",
            )
            if getattr(task_class(name), flag)
        }
        for name in TASKS
    }
    assert declared == {
        "arithmetic": set(),
        "chains": set(),
        "permutations": set(),
        "text": set(),
        "sudoku": {"has_blank"},
        "nqueens": {"multi_solution", "lists_completions"},
        "graph-coloring": {"lists_completions", "multi_solution", "reports_conflicts"},
        "arc-agi-1": {"puzzle_embeddings"},
        "arc-agi-2": {"puzzle_embeddings"},
        "digits": {"has_blank", "image_answers"},
        "maze": {"multi_solution"},
    }
    assert {name for name in TASKS if task_class(name).trains_language_model} == {
        "arithmetic",
        "chains",
        "permutations",
        "text",
    }
    assert get_task("arithmetic").metric == "exact_match" and get_task("text").metric == "perplexity"
    assert get_task("chains").metric == "exact_match"
    assert get_task("permutations").metric == "exact_match"


# Augmentation -----------------------------------------------------------------------------------------------
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([5, 6, 8]))
def test_nqueens_augment_keeps_every_board_a_completion_of_its_input(seed: int, n: int) -> None:
    task = get_task("nqueens", n=n)
    rng = np.random.default_rng(seed)
    solutions = all_solutions(n)
    rows = rng.integers(0, len(solutions), 16)
    labels = np.stack([task.encode(board_from_columns(solutions[r])) for r in rows])
    inputs = labels.copy()
    inputs[rng.random(inputs.shape) < 0.5] = 1  # remove some queens: the label completes the input
    before = inputs.copy(), labels.copy()
    task.augment(inputs, labels, rng)
    for x, y in zip(inputs, labels, strict=True):
        assert task.verify(task.decode(x), task.decode(y))
    # The same symmetry moved each input and its label: the queens kept are still among the label's.
    assert ((inputs == 2) <= (labels == 2)).all()
    assert (inputs == 2).sum() == (before[0] == 2).sum()
    assert not np.array_equal(labels, before[1])


def test_sudoku_augment_keeps_puzzles_and_solutions_valid() -> None:
    task = get_task("sudoku", box="2x3", augment=1)
    rows = list(task.records("train", 0, 4))
    inputs, labels = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    before = inputs.copy()
    task.augment(inputs, labels, np.random.default_rng(3))
    for x, y in zip(inputs, labels, strict=True):
        assert task.verify(task.decode(x), task.decode(y))
    assert ((inputs == 1).sum(axis=1) == (before == 1).sum(axis=1)).all()  # as many blanks as before
    assert not np.array_equal(inputs, before)


@pytest.mark.parametrize(
    "spec", [("graph-coloring", {"n": 5, "train_size": 3}), ("arc-agi-1", {"augment": 1})]
)
def test_tasks_without_a_batch_symmetry_leave_batches_alone(spec) -> None:
    name, options = spec
    task = get_task(name, **options)
    rows = list(task.records("train", 0, 2))
    inputs, labels = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    copy = inputs.copy(), labels.copy()
    rng = np.random.default_rng(0)
    task.augment(inputs, labels, rng)
    assert np.array_equal(inputs, copy[0]) and np.array_equal(labels, copy[1])
    assert rng.integers(1 << 30) == np.random.default_rng(0).integers(1 << 30)  # nothing drawn


# Answers ----------------------------------------------------------------------------------------------------
def test_graph_colouring_answer_key_equates_renamed_colourings() -> None:
    task = get_task("graph-coloring", n=4, colors=3)
    assert task.answer_key((0, 1, 2, 0)) == task.answer_key((2, 0, 1, 2)) == task.answer_key((1, 2, 0, 1))
    assert task.answer_key((0, 1, 2, 0)) != task.answer_key((0, 1, 2, 1))
    # An uncoloured vertex is kept as it is: renaming cannot make it valid.
    assert task.answer_key((0, -1, 1, 0)) == (0, -1, 1, 0) != task.answer_key((1, -1, 0, 1))


def test_graph_colouring_decode_answer_reads_only_the_vertex_slots() -> None:
    task = get_task("graph-coloring", n=3, colors=2)
    tokens = task.encode(Graph.from_edges(3, [(0, 1)]))
    tokens[task.edges_len :] = [4, 5, 9]  # colours 0 and 1, then a token that is no colour
    assert task.decode_answer(tokens) == (0, 1, -1)


def test_the_default_answer_key_tells_different_boards_apart() -> None:
    task = get_task("nqueens", n=5)
    first, second = (board_from_columns(c) for c in all_solutions(5)[:2])
    assert task.answer_key(first) == task.answer_key(first.copy()) != task.answer_key(second)


# The Sudoku package -----------------------------------------------------------------------------------------
def test_the_sudoku_package_exports_its_modules_public_names() -> None:
    package = importlib.import_module("latentloop.tasks.sudoku")
    for name in package.__all__:
        assert getattr(package, name) is not None
    for module in ("solver", "generator", "io", "task"):
        part = importlib.import_module(f"latentloop.tasks.sudoku.{module}")
        public = {
            n
            for n, v in vars(part).items()
            if not n.startswith("_") and getattr(v, "__module__", "") == part.__name__
        }
        assert public <= set(package.__all__), (module, public - set(package.__all__))
    assert TASKS["sudoku"] == "latentloop.tasks.sudoku:SudokuTask"
    assert task_class("sudoku") is package.SudokuTask
