"""Evaluation metrics by value: hand-built predictions with known answers go through ``evaluate_model`` (and
``sample_run``) in place of a model's, and every reported number is compared with the one counted by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from latentloop.eval.generation import sample_run
from latentloop.eval.reasoners import evaluate_model
from latentloop.infer.scaling import SolveResult
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.tasks.base import get_task
from latentloop.tasks.graph_coloring import Graph


def tiny_model(task):
    config = ReasonerConfig(
        vocab_size=task.vocab_size, seq_len=task.seq_len, dim=8, n_heads=2, n_layers=1, hidden=8
    )
    return build_reasoner("trm", config)


def serve_predictions(monkeypatch, predictions: np.ndarray, values: np.ndarray) -> None:
    """Make ``evaluate_model`` see ``predictions`` ``[S, K, N, L]`` and ``values`` ``[S, K, N]`` as the
    model's own, chunk by chunk in the order it asks for the puzzles."""
    served = {"rows": 0}

    def solve(model, x, steps=None, samples=1, **_):
        rows = slice(served["rows"], served["rows"] + len(x))
        served["rows"] += len(x)
        assert samples == predictions.shape[1]
        tokens = torch.from_numpy(predictions[:, :, rows].astype(np.int64))
        scores = torch.from_numpy(values[:, :, rows].astype(np.float32))
        steps_run, k, b = scores.shape
        return SolveResult(
            predictions=tokens,
            values=scores,
            halt_prob=torch.zeros_like(scores),
            halted_at=torch.full((k, b), steps_run, dtype=torch.long),
            chosen_sample=torch.zeros(b, dtype=torch.long),
            chosen=tokens[-1, 0],
        )

    # Patched where evaluate_model looks the name up, wherever the function lives.
    monkeypatch.setattr(sys.modules[evaluate_model.__module__], "solve", solve)


# N-Queens 4x4: the empty board has exactly two solutions.
QUEENS_A, QUEENS_B = (1, 3, 0, 2), (2, 0, 3, 1)


def queens(columns: tuple[int, ...] | None) -> np.ndarray:
    board = np.zeros((4, 4), dtype=bool)
    if columns is not None:
        board[np.arange(4), columns] = True
    return board


@pytest.fixture
def nqueens():
    task = get_task("nqueens", n=4)
    tokens = {
        "A": task.encode(queens(QUEENS_A)),
        "B": task.encode(queens(QUEENS_B)),
        "X": task.encode(queens(None)),  # no queen: invalid
    }
    return task, tokens


def predictions_of(tokens: dict[str, np.ndarray], table: list[list[list[str]]]) -> np.ndarray:
    """``table[step][puzzle][sample]`` names of answers -> token array ``[S, K, N, L]``."""
    return np.array([[[tokens[name] for name in puzzle] for puzzle in step] for step in table]).transpose(
        0, 2, 1, 3
    )


def values_of(table: list[list[list[float]]]) -> np.ndarray:
    """``table[step][puzzle][sample]`` -> ``[S, K, N]``."""
    return np.array(table, dtype=np.float32).transpose(0, 2, 1)


def test_coverage_counts_distinct_valid_answers_over_all_completions(monkeypatch, nqueens) -> None:
    task, tokens = nqueens
    one_given = queens(None)
    one_given[0, QUEENS_A[0]] = True  # only solution A keeps this queen: 1 completion
    inputs = np.stack([task.encode(queens(None))] * 3 + [task.encode(one_given)]).astype(np.int64)
    answers = [
        ["A", "X", "B"],  # both completions, the second at the third sample: 1/2, 1/2, 2/2
        ["A", "A", "X"],  # one completion found twice: 1/2
        ["X", "X", "X"],  # nothing: 0
        ["A", "B", "X"],  # B drops the given queen; A is its only completion: 1/1
    ]
    serve_predictions(monkeypatch, predictions_of(tokens, [answers]), np.zeros((1, 3, 4)))
    report = evaluate_model(tiny_model(task), task, inputs, samples=3, progress=False)
    assert report["coverage"] == pytest.approx((1.0 + 0.5 + 0.0 + 1.0) / 4)
    assert [p["coverage"] for p in report["curve_samples"]] == pytest.approx(
        [(0.5 + 0.5 + 0 + 1) / 4, (0.5 + 0.5 + 0 + 1) / 4, (1.0 + 0.5 + 0 + 1) / 4]
    )
    assert report["oracle_accuracy"] == pytest.approx(3 / 4)


def test_colourings_equal_up_to_renaming_colours_count_once(monkeypatch) -> None:
    task = get_task("graph-coloring", n=3, colors=3)
    path = Graph.from_edges(3, [(0, 1), (1, 2)])  # proper colourings up to renaming: 010 and 012
    assert len(task.solutions(path)) == 2
    inputs = np.stack([task.encode(path)] * 2).astype(np.int64)
    renamed = [(1, 0, 1), (0, 1, 0), (2, 0, 2)]  # one colouring under three names
    different = [(1, 0, 1), (2, 0, 1), (1, 2, 1)]  # 010, 012 and 010 again
    predictions = np.array([[[task.encode(renamed[k]), task.encode(different[k])] for k in range(3)]])
    serve_predictions(monkeypatch, predictions, np.zeros((1, 3, 2)))
    report = evaluate_model(tiny_model(task), task, inputs, samples=3, progress=False)
    assert report["coverage"] == pytest.approx((0.5 + 1.0) / 2)
    assert [p["coverage"] for p in report["curve_samples"]] == pytest.approx([0.5, 0.75, 0.75])


# Five empty 4x4 boards, three samples, two steps. At the last step the three selection rules disagree:
#   puzzle 0: X A A, values .9 .1 .2 -> first X, vote A, value X
#   puzzle 1: X X A, values .1 .2 .9 -> first X, vote X, value A
#   puzzle 2: X A A, values .1 .2 .9 -> first X, vote A, value A
#   puzzle 3: A X X, values .9 .1 .2 -> first A, vote X, value A
#   puzzle 4: X X X                  -> nothing valid
LAST_STEP = [["X", "A", "A"], ["X", "X", "A"], ["X", "A", "A"], ["A", "X", "X"], ["X", "X", "X"]]
LAST_VALUES = [[0.9, 0.1, 0.2], [0.1, 0.2, 0.9], [0.1, 0.2, 0.9], [0.9, 0.1, 0.2], [0.5, 0.5, 0.5]]
# At the first step only puzzles 0 (first sample) and 4 (every sample) are solved:
#   first 2/5, vote 1/5 (X X outvote A on puzzle 0), value 1/5 (puzzle 0's A has the lowest value;
#   puzzle 4's equal values go to its first sample).
FIRST_STEP = [["A", "X", "X"], ["X", "X", "X"], ["X", "X", "X"], ["X", "X", "X"], ["A", "A", "A"]]
FIRST_VALUES = [[0.1, 0.9, 0.9], [0.5] * 3, [0.5] * 3, [0.5] * 3, [0.5] * 3]


@pytest.fixture
def selection_report(monkeypatch, nqueens):
    task, tokens = nqueens
    inputs = np.stack([task.encode(queens(None))] * 5).astype(np.int64)
    serve = (predictions_of(tokens, [FIRST_STEP, LAST_STEP]), values_of([FIRST_VALUES, LAST_VALUES]))

    def report(select: str) -> dict:
        serve_predictions(monkeypatch, *serve)
        return evaluate_model(tiny_model(task), task, inputs, samples=3, select=select, progress=False)

    return report


def test_each_selection_rule_gives_its_own_accuracy(selection_report) -> None:
    report = selection_report("vote")
    # The served halting probabilities are all 0: q's ties go to the first sample.
    expected = {"first": 0.2, "vote": 0.4, "value": 0.6, "q": 0.2}
    assert report["accuracy_by_select"] == pytest.approx(expected)
    assert report["oracle_accuracy"] == pytest.approx(0.8)  # puzzles 0-3 have a valid sample
    for select, expected in (("vote", 0.4), ("value", 0.6), ("first", 0.2)):
        assert selection_report(select)["accuracy"] == pytest.approx(expected), select


def test_accuracy_by_number_of_samples(selection_report) -> None:
    # k = 1: sample 0 alone (puzzle 3). k = 2: vote ties go to the first answer (puzzle 3); value picks
    # puzzle 2's A (.2 > .1) and puzzle 3's A. k = 3: the rules as in the table above.
    curve = selection_report("vote")["curve_samples"]
    assert [p["samples"] for p in curve] == [1, 2, 3]
    assert [p["vote"] for p in curve] == pytest.approx([0.2, 0.2, 0.4])
    assert [p["value"] for p in curve] == pytest.approx([0.2, 0.4, 0.6])


def test_accuracy_over_steps(selection_report) -> None:
    for select, expected in (("vote", [0.2, 0.4]), ("value", [0.2, 0.6]), ("first", [0.4, 0.2])):
        curve = selection_report(select)["curve_steps"]
        assert [p["steps"] for p in curve] == [1, 2]
        assert [p["accuracy"] for p in curve] == pytest.approx(expected), select


# Graph colouring: a triangle with a tail, and a path; two samples each.
TRIANGLE_TAIL = [(0, 1), (0, 2), (1, 2), (2, 3)]
PATH = [(0, 1), (1, 2), (2, 3)]


def edges_with_equal_colours(edges: list[tuple[int, int]], coloring: tuple[int, ...]) -> int:
    return sum(1 for u, v in edges if coloring[u] == coloring[v])


def test_conflicts_are_the_edges_of_the_chosen_colouring(monkeypatch) -> None:
    task = get_task("graph-coloring", n=4, colors=3)
    graphs = [TRIANGLE_TAIL, PATH]
    samples = [[(0, 0, 0, 0), (0, 1, 2, 2)], [(0, 0, 0, 0), (0, 1, 0, 1)]]
    values = [[0.2, 0.8], [0.3, 0.7]]
    conflicts = [
        [edges_with_equal_colours(g, c) for c in row] for g, row in zip(graphs, samples, strict=True)
    ]
    assert conflicts == [[4, 1], [3, 0]]
    inputs = np.stack([task.encode(Graph.from_edges(4, g)) for g in graphs]).astype(np.int64)
    predictions = np.array([[[task.encode(samples[b][k]) for b in range(2)] for k in range(2)]])
    for select, chosen in (("first", [0, 0]), ("value", [1, 1]), ("vote", [0, 0])):  # vote: a tie each
        serve_predictions(monkeypatch, predictions, values_of([values]))
        report = evaluate_model(tiny_model(task), task, inputs, samples=2, select=select, progress=False)
        counted = [conflicts[b][chosen[b]] for b in range(2)]
        assert report["conflicts_total"] == sum(counted), select
        assert report["conflicts_mean"] == pytest.approx(sum(counted) / 2), select


# Unconditional samples: the share of valid boards comes from the verifier -------------------------------------
def sudoku_4x4() -> np.ndarray:
    return np.array([[1, 2, 3, 4], [3, 4, 1, 2], [2, 3, 4, 1], [4, 1, 2, 3]], dtype=np.int8)


def test_valid_fraction_of_samples_is_the_verifiers(monkeypatch) -> None:
    task = get_task("sudoku", n=4)
    grid = sudoku_4x4()
    relabelled = np.array([0, 2, 1, 4, 3], dtype=np.int8)[grid]  # digits 1<->2, 3<->4: still valid
    latin = np.array([[(r + c) % 4 + 1 for c in range(4)] for r in range(4)], dtype=np.int8)  # boxes repeat
    with_blank = grid.copy()
    with_blank[2, 1] = 0
    boards = [grid, latin, relabelled, with_blank, grid]
    tokens = np.stack([task.encode(b) for b in boards])
    expected_valid = [bool(task.verify(task.blank(), b)) for b in boards]
    assert expected_valid == [True, False, True, False, True]
    model = tiny_model(task)
    module = sys.modules[sample_run.__module__]
    monkeypatch.setattr(module, "load_run", lambda run, task_spec=None: (model, task, Path("ckpt"), None))
    monkeypatch.setattr(module, "sample_blanks", lambda *args, **kwargs: (tokens, 2, 0.5))
    report = sample_run("run", n=len(boards))
    assert report["valid"] == sum(expected_valid) == 3
    assert report["valid_fraction"] == pytest.approx(3 / 5)
    assert report["distinct"] == 4  # the first grid twice


def test_the_value_heads_ranking_of_valid_samples_is_its_roc_auc(monkeypatch, nqueens) -> None:
    """Valid samples valued .9, .5, .3 against invalid ones valued .1, .8, .2: 7 of the 9 pairs are ordered."""
    task, tokens = nqueens
    config = ReasonerConfig(
        vocab_size=task.vocab_size, seq_len=task.seq_len, dim=8, n_heads=2, n_layers=1, hidden=8
    )
    gram = build_reasoner("gram", config)  # draws samples, so its value head ranks them
    inputs = np.stack([task.encode(queens(None))] * 2).astype(np.int64)
    answers = [["A", "X", "A"], ["X", "B", "X"]]
    values = values_of([[[0.9, 0.1, 0.5], [0.8, 0.3, 0.2]]])
    serve_predictions(monkeypatch, predictions_of(tokens, [answers]), values)
    report = evaluate_model(gram, task, inputs, samples=3, progress=False)
    assert report["value_auc"] == pytest.approx(7 / 9)
    serve_predictions(monkeypatch, predictions_of(tokens, [answers]), values)
    assert "value_auc" not in evaluate_model(tiny_model(task), task, inputs, samples=3, progress=False)
