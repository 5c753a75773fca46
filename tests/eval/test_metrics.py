"""The judging functions of eval.metrics: validity, answer identity, coverage and conflicts, and the module's
place in the import graph (training and evaluation both import it, so it imports neither)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch

import latentloop.eval.metrics as metrics
import latentloop.eval.reasoners as reasoners
from latentloop.data.labels import IGNORE_LABEL
from latentloop.tasks.base import get_task
from latentloop.tasks.graph_coloring import Graph
from latentloop.tasks.nqueens import all_solutions, board_from_columns


def test_metrics_imports_nothing_from_training_or_the_evaluation_reports():
    tree = ast.parse(Path(metrics.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    assert not [
        m for m in imported if m and (m.startswith("latentloop.train") or m == "latentloop.eval.reasoners")
    ]


def test_eval_reasoners_still_exports_the_judging_functions():
    for name in (
        "answers_valid",
        "answer_key",
        "decode_answer",
        "quick_accuracy",
        "unique_rows",
        "example_answers",
    ):
        assert getattr(reasoners, name) is getattr(metrics, name)


def test_judge_gives_renamed_colourings_one_key_and_counts_violations():
    task = get_task("graph-coloring", n=3, colors=3)
    graph = Graph.from_edges(3, [(0, 1), (1, 2)])
    inputs = task.encode(graph)[None]
    colourings = [(0, 1, 0), (2, 0, 2), (0, 0, 1), (1, 2, 1)]  # valid, renamed, one conflict, renamed again
    predictions = np.stack([task.encode(c) for c in colourings])[None, :, None]  # [S=1, K=4, B=1, L]
    violations, key_ids, puzzles = metrics.judge(task, inputs, predictions)
    assert violations[0, :, 0].tolist() == [0, 0, 1, 0]
    assert key_ids[0, :, 0].tolist() == [0, 0, 1, 0]
    assert puzzles == [graph]
    valid = violations[0] == 0
    assert metrics.coverage_curve(key_ids[0], valid, metrics.solution_totals(task, puzzles)) == [0.5] * 4
    chosen = metrics.chosen_samples(key_ids[0], np.array([[0.1], [0.2], [0.9], [0.3]]), "value")
    assert chosen.tolist() == [2]
    assert metrics.conflict_counts(violations[0], chosen) == {"conflicts_total": 1, "conflicts_mean": 1.0}
    assert metrics.chosen_samples(key_ids[0], np.zeros((4, 1)), "vote").tolist() == [0]


def test_coverage_counts_distinct_valid_answers_over_all_of_them():
    key_ids = np.array([[0, 5], [1, 5], [0, 6]])  # [K=3, B=2]
    valid = np.array([[True, True], [True, False], [True, True]])
    assert metrics.coverage_curve(key_ids, valid, np.array([2, 4])) == [0.375, 0.625, 0.75]


def test_answers_valid_accepts_any_completion_the_verifier_accepts():
    task = get_task("nqueens", n=5)
    first, second = (task.encode(board_from_columns(c)) for c in all_solutions(5)[:2])
    empty = np.full_like(first, 1)
    assert metrics.answers_valid(task, np.stack([empty, empty]), np.stack([first, second])).tolist() == [
        True,
        True,
    ]
    assert metrics.answers_valid(task, np.stack([first]), np.stack([second])).tolist() == [False]


def test_answer_exact_ignores_unscored_positions():
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3], [1, 1, 3]]), 4).float()
    labels = torch.tensor([[1, IGNORE_LABEL, 3], [1, 2, 3]])
    assert metrics.answer_exact(logits, labels).tolist() == [True, False]
