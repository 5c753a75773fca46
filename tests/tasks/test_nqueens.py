"""N-Queens: solution counts, parsing, the GRAM dataset protocol, verification."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from latentloop.errors import UsageError
from latentloop.tasks import get_task
from latentloop.tasks import nqueens as Q

KNOWN_COUNTS = [1, 0, 0, 2, 10, 4, 40, 92, 352, 724, 2680, 14200]
SETTINGS = settings(max_examples=40, deadline=None)


def test_solution_counts_n_1_to_12() -> None:
    assert [Q.count_solutions(n) for n in range(1, 13)] == KNOWN_COUNTS


def test_every_enumerated_solution_is_valid_and_distinct() -> None:
    sols = Q.all_solutions(8)
    assert len({tuple(s) for s in sols}) == 92
    assert all(Q.attacking_pairs(Q.board_from_columns(s)) == 0 for s in sols)


def test_parse_forms_and_errors() -> None:
    task = get_task("nqueens", n="4")
    board = task.parse(".Q..\n...Q\nQ...\n..Q.")
    assert board.sum() == 4 and board[0, 1]
    assert (task.parse("0100000110000010") == board).all()
    assert (task.parse(".Q..|...Q|Q.../..Q.") == board).all()  # row separators
    assert task.format(board) == ".Q.....QQ.....Q."
    with pytest.raises(UsageError, match="needs 16 cells"):
        task.parse("." * 15)
    with pytest.raises(UsageError, match="unexpected character 'x'"):
        task.parse("x" + "." * 15)
    with pytest.raises(UsageError, match="attack each other"):
        task.parse("QQ" + "." * 14)
    # An answer may contain attacks: it is then invalid, not unreadable.
    assert task.violations(task.parse("." * 16), task.parse_answer("QQ" + "." * 14)) > 0


def test_completions_keep_the_givens() -> None:
    task = get_task("nqueens")
    puzzle = np.zeros((8, 8), bool)
    puzzle[0, 0] = True
    found = task.solutions(puzzle)
    assert len(found) == 4  # the 8-queens solutions with a queen in a corner
    assert all(task.verify(puzzle, f) for f in found)
    assert len(task.solutions(np.zeros((8, 8), bool))) == 92


def test_gram_dataset_8x8() -> None:
    task = get_task("nqueens", n=8)
    assert task.k == [5, 6, 7]
    train, test = task.split_inputs("train"), task.split_inputs("test")
    # 92 solutions x (C(8,5) + C(8,6) + C(8,7)) = 8464 removals, 5148 of them distinct; split 85:15.
    assert len(train) + len(test) == 5148
    assert abs(len(train) / (len(train) + len(test)) - 0.85) < 0.01
    assert not {p.tobytes() for p in train} & {p.tobytes() for p in test}
    assert [p.tobytes() for p in task.split_inputs("train", seed=0)] == [p.tobytes() for p in train]
    for partial in train[:200]:
        kept = int((partial >= 0).sum())
        assert 8 - kept in (5, 6, 7)
        board = np.zeros((8, 8), bool)
        board[np.nonzero(partial >= 0)[0], partial[partial >= 0]] = True
        completions = task.completions_of(partial)
        # Coverage needs every completion: compare with the exact search from the board.
        assert sorted(map(tuple, completions)) == sorted(Q.enumerate_solutions(8, board))


def test_gram_dataset_10x10_size() -> None:
    task = get_task("nqueens", n="10")
    assert task.k == [7, 8, 9]
    train, test = task.split_inputs("train"), task.split_inputs("test")
    assert 30_000 < len(train) < 45_000 and 5_000 < len(test) < 8_000
    rows = sum(len(task.completions_of(p)) for p in test)
    assert rows > len(test)  # several inputs have more than one completion


def test_examples_pair_inputs_with_valid_completions() -> None:
    task = get_task("nqueens", n=6)
    pairs = list(task.examples("test"))
    assert pairs and all(task.verify(x, y) for x, y in pairs)


@SETTINGS
@given(index=st.integers(0, 91), row=st.integers(0, 7), col=st.integers(0, 7))
def test_corrupted_answer_is_rejected(index: int, row: int, col: int) -> None:
    task = get_task("nqueens")
    solution = Q.board_from_columns(Q.all_solutions(8)[index])
    assert task.verify(np.zeros((8, 8), bool), solution)
    corrupted = solution.copy()
    corrupted[row, col] = not corrupted[row, col]  # one cell changed: a queen added or removed
    assert not task.verify(np.zeros((8, 8), bool), corrupted)
    assert task.violations(np.zeros((8, 8), bool), corrupted) > 0


@SETTINGS
@given(index=st.integers(0, 91), other=st.integers(0, 91))
def test_answer_must_keep_the_given_queens(index: int, other: int) -> None:
    task = get_task("nqueens")
    sols = Q.all_solutions(8)
    puzzle = Q.board_from_columns(sols[index])
    puzzle[:5] = False  # 5 queens removed
    answer = Q.board_from_columns(sols[other])
    keeps = bool((answer[puzzle]).all())
    assert task.verify(puzzle, answer) == keeps


@SETTINGS
@given(bits=st.lists(st.booleans(), min_size=64, max_size=64))
def test_encode_decode_round_trip(bits: list[bool]) -> None:
    task = get_task("nqueens")
    board = np.array(bits).reshape(8, 8)
    tokens = task.encode(board)
    assert set(np.unique(tokens)) <= {Q.EMPTY, Q.QUEEN}
    assert (task.decode(tokens) == board).all()
    assert task.parse_answer(task.format(board)).tobytes() == board.tobytes()


@pytest.mark.parametrize(
    "options", [{"n": "x"}, {"n": "0"}, {"n": "20"}, {"k": "9"}, {"k": "a,b"}, {"m": "1"}]
)
def test_bad_options(options: dict[str, str]) -> None:
    with pytest.raises(UsageError):
        get_task("nqueens", **options)


def test_draw_marks_attacked_queens_red_and_dropped_givens() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    task = get_task("nqueens", n=4)
    puzzle = np.zeros((4, 4), bool)
    puzzle[0, 0] = puzzle[3, 3] = True
    answer = np.zeros((4, 4), bool)
    answer[0, 0] = answer[1, 1] = answer[2, 3] = True  # (0,0) and (1,1) share a diagonal; given (3,3) dropped
    fig, ax = plt.subplots()
    task.draw(ax, puzzle, answer)
    drawn = {
        tuple(c.get_offsets()[0][::-1].astype(int)): to_hex(c.get_facecolor()[0]) for c in ax.collections
    }
    plt.close(fig)
    red, blue = to_hex("tab:red"), to_hex("tab:blue")
    assert drawn == {(0, 0): red, (1, 1): red, (2, 3): blue, (3, 3): red}


def _logits_for(task: Q.NQueensTask, board: np.ndarray, confidence: float = 3.0) -> torch.Tensor:
    """Logits ``[1, n*n, 3]`` whose most likely answer is ``board``."""
    tokens = torch.from_numpy(task.encode(board).astype(np.int64))
    logits = torch.zeros(1, task.seq_len, 3)
    logits[0, torch.arange(task.seq_len), tokens] = confidence
    return logits


def test_nearest_completion_is_the_likeliest_completion_that_keeps_the_givens() -> None:
    task = get_task("nqueens", n=8)
    solutions = Q.all_solutions(8)
    given = Q.board_from_columns(solutions[0]) & (np.arange(8) == 0)[:, None]  # the first row's queen
    completions = task.completions_of(np.where(np.arange(8) == 0, solutions[0][0], -1))
    assert len(completions) >= 2
    inputs = torch.from_numpy(task.encode(given).astype(np.int64))[None]
    # An answer one queen off a completion: the nearest completion is that one.
    wanted = Q.board_from_columns(completions[1])
    near = wanted.copy()
    row = 3
    near[row] = np.roll(near[row], 1)
    chosen = task.nearest_completion(inputs, _logits_for(task, near))[0].numpy()
    assert np.array_equal(chosen, task.encode(wanted))
    # A solution that drops the given queen is never chosen, however likely.
    elsewhere = next(s for s in solutions if s[0] != solutions[0][0])
    chosen = task.nearest_completion(inputs, _logits_for(task, Q.board_from_columns(elsewhere), 50.0))[0]
    assert chosen.numpy()[solutions[0][0]] == Q.QUEEN
    assert task.verify(given, task.decode(chosen.numpy()))
