"""Verifiers judged by the constraints they enforce: for each rule, an answer that breaks that rule alone
must be refused (with the exact violation count where the task defines one), and random answers are judged
as an independent brute-force checker judges them."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.tasks.arc import ArcPuzzle
from latentloop.tasks.base import get_task
from latentloop.tasks.graph_coloring import Graph

BOX_SHAPES = [(2, 2), (2, 3), (2, 4), (3, 3)]
PROPERTY_SETTINGS = settings(max_examples=80, deadline=None)


def run_cli(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out, _ = capsys.readouterr()
    return code, json.loads(out)


# ----------------------------------------------------------------------------------------------------------
# Independent checkers: written from the rules of each puzzle, sharing no code with the package
# ----------------------------------------------------------------------------------------------------------


def queens_of(board: np.ndarray) -> list[tuple[int, int]]:
    return [(r, c) for r in range(board.shape[0]) for c in range(board.shape[1]) if board[r, c]]


def nqueens_violations_by_hand(puzzle: np.ndarray, answer: np.ndarray) -> int:
    """Attacking pairs (same row, column or diagonal), missing queens and dropped givens."""
    queens = queens_of(answer)
    attacking = sum(
        1
        for (r1, c1), (r2, c2) in itertools.combinations(queens, 2)
        if r1 == r2 or c1 == c2 or abs(r1 - r2) == abs(c1 - c2)
    )
    missing = max(0, answer.shape[0] - len(queens))
    dropped = sum(1 for r, c in queens_of(puzzle) if not answer[r, c])
    return attacking + missing + dropped


def nqueens_valid_by_hand(puzzle: np.ndarray, answer: np.ndarray) -> bool:
    queens = queens_of(answer)
    n = answer.shape[0]
    rows, cols = [r for r, _ in queens], [c for _, c in queens]
    downs, ups = [r - c for r, c in queens], [r + c for r, c in queens]
    distinct = all(len(set(key)) == len(key) for key in (rows, cols, downs, ups))
    givens_kept = all(answer[r, c] for r, c in queens_of(puzzle))
    return len(queens) == n and distinct and givens_kept


def all_nqueens_solutions(n: int) -> list[tuple[int, ...]]:
    """Every solution as the queen's column per row, by plain backtracking."""
    found: list[tuple[int, ...]] = []

    def place(columns: tuple[int, ...]) -> None:
        row = len(columns)
        if row == n:
            found.append(columns)
            return
        for col in range(n):
            if all(col != c and abs(col - c) != row - r for r, c in enumerate(columns)):
                place((*columns, col))

    place(())
    return found


def board(columns: tuple[int, ...] | list[int]) -> np.ndarray:
    n = len(columns)
    grid = np.zeros((n, n), dtype=bool)
    for row, col in enumerate(columns):
        if col >= 0:
            grid[row, col] = True
    return grid


def sudoku_units(box: tuple[int, int]) -> list[list[tuple[int, int]]]:
    box_rows, box_cols = box
    n = box_rows * box_cols
    rows = [[(r, c) for c in range(n)] for r in range(n)]
    cols = [[(r, c) for r in range(n)] for c in range(n)]
    boxes = [
        [(top + i, left + j) for i in range(box_rows) for j in range(box_cols)]
        for top in range(0, n, box_rows)
        for left in range(0, n, box_cols)
    ]
    return rows + cols + boxes


def sudoku_violations_by_hand(puzzle: np.ndarray, answer: np.ndarray, box: tuple[int, int]) -> int:
    """Digits missing from each row, column and box, plus givens the answer changed."""
    n = box[0] * box[1]
    missing = sum(
        n - len({int(answer[r, c]) for r, c in unit if 1 <= answer[r, c] <= n}) for unit in sudoku_units(box)
    )
    changed = sum(1 for r in range(n) for c in range(n) if puzzle[r, c] and puzzle[r, c] != answer[r, c])
    return missing + changed


def sudoku_valid_by_hand(puzzle: np.ndarray, answer: np.ndarray, box: tuple[int, int]) -> bool:
    n = box[0] * box[1]
    digits = set(range(1, n + 1))
    units_ok = all({int(answer[r, c]) for r, c in unit} == digits for unit in sudoku_units(box))
    givens_kept = all(answer[r, c] == puzzle[r, c] for r in range(n) for c in range(n) if puzzle[r, c])
    return units_ok and givens_kept


def valid_sudoku(box: tuple[int, int]) -> np.ndarray:
    """A complete grid: row ``r`` is the digits shifted by ``box_cols * (r % box_rows) + r // box_rows``."""
    box_rows, box_cols = box
    n = box_rows * box_cols
    return np.array(
        [[(box_cols * (r % box_rows) + r // box_rows + c) % n + 1 for c in range(n)] for r in range(n)],
        dtype=np.int8,
    )


def cyclic_latin_square(n: int) -> np.ndarray:
    """Every row and column a permutation of 1..n, but the top-left box holds the digit 2 twice."""
    return np.array([[(r + c) % n + 1 for c in range(n)] for r in range(n)], dtype=np.int8)


def coloring_conflicts_by_hand(edges: list[tuple[int, int]], coloring: tuple[int, ...]) -> int:
    return sum(1 for u, v in edges if coloring[u] == coloring[v])


def coloring_valid_by_hand(edges: list[tuple[int, int]], coloring: tuple[int, ...], colors: int) -> bool:
    in_range = all(0 <= c < colors for c in coloring)
    return in_range and all(coloring[u] != coloring[v] for u, v in edges)


def grid_text(grid: np.ndarray) -> str:
    return "".join(str(int(v)) if v else "." for v in np.asarray(grid).ravel())


def queens_text(grid: np.ndarray) -> str:
    return "".join("Q" if q else "." for q in np.asarray(grid).ravel())


# ----------------------------------------------------------------------------------------------------------
# N-Queens: one answer per constraint family
# ----------------------------------------------------------------------------------------------------------

# Rows and columns all distinct; exactly one pair of queens on a shared diagonal of each direction.
DOWN_DIAGONAL_PAIR = (0, 1, 3, 5, 7, 2, 4, 6)  # rows 0 and 1 share r - c = 0
UP_DIAGONAL_PAIR = (0, 2, 6, 5, 7, 4, 1, 3)  # rows 2 and 3 share r + c = 8


@pytest.mark.parametrize("columns", [DOWN_DIAGONAL_PAIR, UP_DIAGONAL_PAIR], ids=["r-c", "r+c"])
def test_nqueens_refuses_a_diagonal_attack_between_distinct_rows_and_columns(columns, capsys) -> None:
    task = get_task("nqueens", n=8)
    answer, empty = board(columns), np.zeros((8, 8), dtype=bool)
    assert sorted(columns) == list(range(8))  # one queen in every row and every column
    assert nqueens_violations_by_hand(empty, answer) == 1
    assert not task.verify(empty, answer)
    assert task.violations(empty, answer) == 1
    code, report = run_cli(capsys, "check", "nqueens:n=8", queens_text(empty), queens_text(answer), "--json")
    assert code == 1 and report == {"valid": False, "violations": 1}


def test_nqueens_accepts_every_solution_of_the_empty_board() -> None:
    task = get_task("nqueens", n=6)
    empty = np.zeros((6, 6), dtype=bool)
    solutions = all_nqueens_solutions(6)
    assert len(solutions) == 4
    for columns in solutions:
        assert task.verify(empty, board(columns)) and task.violations(empty, board(columns)) == 0


def test_nqueens_refuses_a_valid_board_that_drops_a_given_queen(capsys) -> None:
    task = get_task("nqueens", n=8)
    solutions = all_nqueens_solutions(8)
    first = solutions[0]
    other = next(s for s in solutions if s[0] != first[0])  # a solution elsewhere in row 0
    puzzle = board([first[0]] + [-1] * 7)  # the only given: row 0's queen of the first solution
    assert nqueens_valid_by_hand(np.zeros((8, 8), dtype=bool), board(other))
    assert not task.verify(puzzle, board(other)) and task.violations(puzzle, board(other)) == 1
    assert task.verify(puzzle, board(first))
    code, report = run_cli(
        capsys, "check", "nqueens:n=8", queens_text(puzzle), queens_text(board(other)), "--json"
    )
    assert code == 1 and report == {"valid": False, "violations": 1}


def test_nqueens_refuses_too_few_queens_and_a_board_of_the_wrong_size() -> None:
    task = get_task("nqueens", n=8)
    empty = np.zeros((8, 8), dtype=bool)
    short = board(all_nqueens_solutions(8)[0])
    short[7] = False  # seven queens, none attacking
    assert not task.verify(empty, short) and task.violations(empty, short) == 1
    with pytest.raises(UsageError):
        task.verify(empty, np.zeros((7, 7), dtype=bool))


# ----------------------------------------------------------------------------------------------------------
# Sudoku: one answer per constraint family, for every box shape
# ----------------------------------------------------------------------------------------------------------


def box_name(box: tuple[int, int]) -> str:
    return f"{box[0]}x{box[1]}"


@pytest.mark.parametrize("box", BOX_SHAPES, ids=box_name)
def test_sudoku_accepts_a_valid_grid(box) -> None:
    task = get_task("sudoku", box=box_name(box))
    grid, blank = valid_sudoku(box), np.zeros((task.n, task.n), dtype=np.int8)
    assert sudoku_valid_by_hand(blank, grid, box)
    assert task.verify(blank, grid) and task.violations(blank, grid) == 0
    assert task.verify(grid, grid)  # every cell given and kept


@pytest.mark.parametrize("box", BOX_SHAPES, ids=box_name)
def test_sudoku_refuses_a_latin_square_whose_boxes_repeat_digits(box, capsys) -> None:
    task = get_task("sudoku", box=box_name(box))
    n = task.n
    blank = np.zeros((n, n), dtype=np.int8)
    latin = cyclic_latin_square(n)
    # Two rows of different bands swapped: rows and columns stay permutations, two bands' boxes break.
    swapped = valid_sudoku(box)
    swapped[[0, box[0]]] = swapped[[box[0], 0]]
    for answer in (latin, swapped):
        units = sudoku_units(box)
        assert all(len({int(answer[r, c]) for r, c in unit}) == n for unit in units[: 2 * n])
        expected = sudoku_violations_by_hand(blank, answer, box)
        assert expected > 0
        assert not task.verify(blank, answer)
        assert task.violations(blank, answer) == expected
        code, report = run_cli(
            capsys, "check", "sudoku", grid_text(blank), grid_text(answer), "--n", str(n), "--json"
        )
        assert code == 1 and report == {"valid": False, "violations": expected}


def test_sudoku_box_violations_of_the_cyclic_9x9_grid_counted_by_hand() -> None:
    # Each 3x3 box of (r + c) % 9 + 1 holds 5 distinct digits (offsets 0..4): 4 missing in each of 9 boxes.
    task = get_task("sudoku", n=9)
    assert task.violations(np.zeros((9, 9), dtype=np.int8), cyclic_latin_square(9)) == 36


@pytest.mark.parametrize("box", BOX_SHAPES, ids=box_name)
def test_sudoku_refuses_a_valid_grid_that_changes_a_given(box, capsys) -> None:
    task = get_task("sudoku", box=box_name(box))
    n = task.n
    grid = valid_sudoku(box)
    puzzle = np.zeros((n, n), dtype=np.int8)
    puzzle[0, 0] = grid[0, 0]
    # Swapping two digits everywhere keeps a grid valid; it changes the one given.
    relabel = np.arange(n + 1)
    relabel[[grid[0, 0], grid[0, 1]]] = relabel[[grid[0, 1], grid[0, 0]]]
    answer = relabel[grid].astype(np.int8)
    assert sudoku_valid_by_hand(np.zeros_like(puzzle), answer, box)
    assert not task.verify(puzzle, answer) and task.violations(puzzle, answer) == 1
    code, report = run_cli(
        capsys, "check", "sudoku", grid_text(puzzle), grid_text(answer), "--n", str(n), "--json"
    )
    assert code == 1 and report == {"valid": False, "violations": 1}


@pytest.mark.parametrize("box", BOX_SHAPES, ids=box_name)
def test_sudoku_refuses_a_blank_cell(box) -> None:
    task = get_task("sudoku", box=box_name(box))
    blank = np.zeros((task.n, task.n), dtype=np.int8)
    answer = valid_sudoku(box)
    answer[1, 2] = 0  # its row, its column and its box each miss one digit
    assert not task.verify(blank, answer) and task.violations(blank, answer) == 3


def test_sudoku_check_refuses_an_answer_with_a_cell_too_few(capsys) -> None:
    code = main(["check", "sudoku", "." * 16, grid_text(valid_sudoku((2, 2)))[:-1], "--n", "4"])
    _, err = capsys.readouterr()
    assert code == 2 and "16 cells" in err


@pytest.mark.parametrize("cells", [15, 17, 64])
def test_sudoku_verify_refuses_an_answer_with_the_wrong_number_of_cells(cells) -> None:
    task = get_task("sudoku", n=4)
    flat = np.resize(valid_sudoku((2, 2)).ravel(), cells)
    with pytest.raises(UsageError, match=f"has 16 cells, got {cells}"):
        task.verify(np.zeros((4, 4), dtype=np.int8), flat)


# ----------------------------------------------------------------------------------------------------------
# Graph colouring
# ----------------------------------------------------------------------------------------------------------

FIVE_CYCLE = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)]


def test_coloring_counts_each_conflicting_edge(capsys) -> None:
    task = get_task("graph-coloring", n=5, colors=3)
    graph = Graph.from_edges(5, FIVE_CYCLE)
    assert task.verify(graph, (0, 1, 0, 1, 2)) and task.violations(graph, (0, 1, 0, 1, 2)) == 0
    one = (0, 1, 0, 1, 1)  # only edge 3-4 joins equal colours
    assert coloring_conflicts_by_hand(FIVE_CYCLE, one) == 1
    assert not task.verify(graph, one) and task.violations(graph, one) == 1
    two = (0, 0, 0, 1, 2)  # edges 0-1 and 1-2
    assert task.violations(graph, two) == 2
    edge_list = ",".join(f"{u}-{v}" for u, v in FIVE_CYCLE)
    code, report = run_cli(capsys, "check", "graph-coloring", edge_list, "01011", "--colors", "3", "--json")
    assert code == 1 and report == {"valid": False, "violations": 1}


def test_coloring_refuses_a_colour_out_of_range(capsys) -> None:
    task = get_task("graph-coloring", n=5, colors=3)
    graph = Graph.from_edges(5, FIVE_CYCLE)
    for coloring in ((0, 1, 0, 1, 3), (0, 1, 0, 1, -1)):  # no edge joins equal colours
        assert coloring_conflicts_by_hand(FIVE_CYCLE, coloring) == 0
        assert not task.verify(graph, coloring) and task.violations(graph, coloring) == 1
    edge_list = ",".join(f"{u}-{v}" for u, v in FIVE_CYCLE)
    code, report = run_cli(capsys, "check", "graph-coloring", edge_list, "01013", "--colors", "3", "--json")
    assert code == 1 and report == {"valid": False, "violations": 1}


def test_coloring_of_the_wrong_length_is_refused() -> None:
    task = get_task("graph-coloring", n=5, colors=3)
    with pytest.raises(UsageError):
        task.verify(Graph.from_edges(5, FIVE_CYCLE), (0, 1, 0, 1))


# ----------------------------------------------------------------------------------------------------------
# ARC: an answer is right when it is the test output, cell for cell
# ----------------------------------------------------------------------------------------------------------


def test_arc_counts_the_cells_that_differ_from_the_test_output() -> None:
    task = get_task("arc-agi-1")
    solution = np.array([[1, 2, 0], [3, 3, 4]], dtype=np.int8)
    puzzle = ArcPuzzle("t", [], np.zeros((2, 2), dtype=np.int8), solution)
    assert task.verify(puzzle, solution.copy()) and task.violations(puzzle, solution.copy()) == 0
    one_cell = solution.copy()
    one_cell[1, 2] = 7
    assert not task.verify(puzzle, one_cell) and task.violations(puzzle, one_cell) == 1
    assert task.violations(puzzle, solution.T.copy()) == 6  # same colours, wrong shape: every cell
    with pytest.raises(UsageError):
        task.verify(ArcPuzzle("t", [], np.zeros((2, 2), dtype=np.int8)), solution)


# ----------------------------------------------------------------------------------------------------------
# Properties: the verifier against the brute-force checkers on random and perturbed answers
# ----------------------------------------------------------------------------------------------------------

NQUEENS_SOLUTIONS = {n: all_nqueens_solutions(n) for n in range(4, 9)}


@st.composite
def nqueens_cases(draw) -> tuple[int, np.ndarray, np.ndarray]:
    n = draw(st.integers(4, 8))
    solution = board(draw(st.sampled_from(NQUEENS_SOLUTIONS[n])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    puzzle = solution & (rng.random((n, n)) < 0.3)
    kind = draw(st.sampled_from(["keep", "move", "remove", "add", "swap-rows", "stray-given", "random"]))
    answer = solution.copy()
    queens = queens_of(solution)
    if kind == "move":
        r, c = queens[rng.integers(n)]
        answer[r, c] = False
        answer[rng.integers(n), rng.integers(n)] = True
    elif kind == "remove":
        answer[queens[rng.integers(n)]] = False
    elif kind == "add":
        answer[rng.integers(n), rng.integers(n)] = True
    elif kind == "swap-rows":  # rows and columns stay distinct; diagonals usually break
        a, b = rng.choice(n, 2, replace=False)
        answer[[a, b]] = answer[[b, a]]
    elif kind == "stray-given":
        puzzle[rng.integers(n), rng.integers(n)] = True
    elif kind == "random":
        answer = rng.random((n, n)) < 1.0 / n
    event(kind)
    return n, puzzle, answer


@st.composite
def sudoku_cases(draw) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    box = draw(st.sampled_from(BOX_SHAPES))
    box_rows, box_cols = box
    n = box_rows * box_cols
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # A random valid grid: relabel the digits, permute bands and the rows inside them, stacks and columns.
    rows = np.concatenate(
        [band * box_rows + rng.permutation(box_rows) for band in rng.permutation(n // box_rows)]
    )
    cols = np.concatenate(
        [stack * box_cols + rng.permutation(box_cols) for stack in rng.permutation(n // box_cols)]
    )
    digits = np.concatenate([[0], rng.permutation(n) + 1])
    solution = digits[valid_sudoku(box)[np.ix_(rows, cols)]].astype(np.int8)
    puzzle = np.where(rng.random((n, n)) < 0.3, solution, 0).astype(np.int8)
    kind = draw(
        st.sampled_from(
            [
                "keep",
                "swap-in-row",
                "swap-rows-across-bands",
                "swap-rows-in-band",
                "change",
                "blank",
                "relabel",
            ]
        )
    )
    answer = solution.copy()
    r, c = int(rng.integers(n)), int(rng.integers(n))
    if kind == "swap-in-row":
        d = int(rng.integers(n))
        answer[r, [c, d]] = answer[r, [d, c]]
    elif kind == "swap-rows-across-bands":  # a Latin square whose boxes may repeat digits
        other = (r + box_rows * int(rng.integers(1, n // box_rows))) % n  # every shape has 2+ bands
        answer[[r, other]] = answer[[other, r]]
    elif kind == "swap-rows-in-band":  # still a valid grid
        band = r - r % box_rows
        a, b = band + rng.choice(box_rows, 2, replace=False)
        answer[[a, b]] = answer[[b, a]]
    elif kind == "change":
        answer[r, c] = int(rng.integers(1, n + 1))
    elif kind == "blank":
        answer[r, c] = 0
    elif kind == "relabel":  # still a valid grid; a given of either digit changes
        a, b = rng.choice(np.arange(1, n + 1), 2, replace=False)
        answer = np.where(solution == a, b, np.where(solution == b, a, solution)).astype(np.int8)
    event(kind)
    return box, puzzle, answer


@st.composite
def coloring_cases(draw) -> tuple[int, int, list[tuple[int, int]], tuple[int, ...]]:
    n = draw(st.integers(2, 8))
    colors = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    coloring = [int(c) for c in rng.integers(colors, size=n)]
    # Edges only between different colours: the colouring is proper until perturbed.
    edges = [(u, v) for u, v in itertools.combinations(range(n), 2) if coloring[u] != coloring[v]]
    edges = [e for e in edges if rng.random() < 0.6]
    kind = draw(st.sampled_from(["keep", "same-colour-edge", "out-of-range", "recolour"]))
    if kind == "same-colour-edge":
        same = [(u, v) for u, v in itertools.combinations(range(n), 2) if coloring[u] == coloring[v]]
        if same:
            edges.append(same[rng.integers(len(same))])
    elif kind == "out-of-range":
        coloring[rng.integers(n)] = int(rng.choice([-1, colors, colors + 3]))
    elif kind == "recolour":
        coloring[rng.integers(n)] = int(rng.integers(colors))
    event(kind)
    return n, colors, edges, tuple(coloring)


def test_nqueens_verifier_agrees_with_a_brute_force_checker() -> None:
    outcomes: Counter[bool] = Counter()

    @PROPERTY_SETTINGS
    @given(case=nqueens_cases())
    def check(case) -> None:
        n, puzzle, answer = case
        task = get_task("nqueens", n=n)
        expected = nqueens_valid_by_hand(puzzle, answer)
        outcomes[expected] += 1
        event("valid" if expected else "invalid")
        assert task.verify(puzzle, answer) == expected
        assert task.violations(puzzle, answer) == nqueens_violations_by_hand(puzzle, answer)

    check()
    assert outcomes[True] > 0 and outcomes[False] > 0, outcomes


def test_sudoku_verifier_agrees_with_a_brute_force_checker() -> None:
    outcomes: Counter[bool] = Counter()

    @PROPERTY_SETTINGS
    @given(case=sudoku_cases())
    def check(case) -> None:
        box, puzzle, answer = case
        task = get_task("sudoku", box=box_name(box))
        expected = sudoku_valid_by_hand(puzzle, answer, box)
        outcomes[expected] += 1
        event("valid" if expected else "invalid")
        assert task.verify(puzzle, answer) == expected
        assert task.violations(puzzle, answer) == sudoku_violations_by_hand(puzzle, answer, box)

    check()
    assert outcomes[True] > 0 and outcomes[False] > 0, outcomes


def test_coloring_verifier_agrees_with_a_brute_force_checker() -> None:
    outcomes: Counter[bool] = Counter()

    @PROPERTY_SETTINGS
    @given(case=coloring_cases())
    def check(case) -> None:
        n, colors, edges, coloring = case
        task = get_task("graph-coloring", n=n, colors=colors)
        graph = Graph.from_edges(n, edges)
        expected = coloring_valid_by_hand(edges, coloring, colors)
        outcomes[expected] += 1
        event("valid" if expected else "invalid")
        assert task.verify(graph, coloring) == expected
        out_of_range = sum(1 for c in coloring if not 0 <= c < colors)
        assert task.violations(graph, coloring) == coloring_conflicts_by_hand(edges, coloring) + out_of_range

    check()
    assert outcomes[True] > 0 and outcomes[False] > 0, outcomes
