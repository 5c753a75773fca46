"""Sudoku's rules and its exact counting solver.

Grids are ``np.int8`` arrays of shape ``(N, N)`` with ``N = box_rows * box_cols`` and 0 for a blank.

The solver is a numba kernel: digits as bit masks per row, column and box, naked and hidden singles until
nothing changes, then a guess on the cell with the fewest candidates, with an explicit stack instead of
recursion. Its *guesses* (every trial placement at a branch point, while counting up to the limit) are the
difficulty rating, like the backtrack count of tdoku that rates Sudoku-Extreme.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from latentloop.errors import UsageError

BOX_FOR_SIZE = {4: (2, 2), 6: (2, 3), 8: (2, 4), 9: (3, 3)}


# ----------------------------------------------------------------------------------------------------------
# Geometry and the numba kernels
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    """Index tables for an ``N x N`` grid of ``box_rows x box_cols`` boxes (flat cell index ``r * N + c``)."""

    box_rows: int
    box_cols: int
    n: int
    units: np.ndarray  # [3N, N] cells of every row, column and box
    row_of: np.ndarray
    col_of: np.ndarray
    box_of: np.ndarray
    popcount: np.ndarray  # [2**N] number of set bits, for the fewest-candidates choice


@functools.cache
def geometry(box_rows: int, box_cols: int) -> Geometry:
    """The (cached) index tables for boxes of ``box_rows x box_cols`` cells."""
    n = box_rows * box_cols
    cells = np.arange(n * n, dtype=np.int32)
    row_of, col_of = cells // n, cells % n
    box_of = (row_of // box_rows) * (n // box_cols) + col_of // box_cols
    units = np.concatenate(
        [np.stack([cells[key == u] for u in range(n)]) for key in (row_of, col_of, box_of)]
    ).astype(np.int32)
    popcount = np.array([bin(m).count("1") for m in range(1 << n)], dtype=np.int32)
    return Geometry(box_rows, box_cols, n, units, row_of, col_of, box_of, popcount)


@njit(cache=True)
def _fill_masks(g, row_of, col_of, box_of, rows, cols, boxes):  # pragma: no cover - numba
    """Digit masks of every row, column and box; False when two givens clash."""
    rows[:] = 0
    cols[:] = 0
    boxes[:] = 0
    for c in range(g.shape[0]):
        d = g[c]
        if d:
            bit = 1 << (d - 1)
            if (rows[row_of[c]] | cols[col_of[c]] | boxes[box_of[c]]) & bit:
                return False
            rows[row_of[c]] |= bit
            cols[col_of[c]] |= bit
            boxes[box_of[c]] |= bit
    return True


@njit(cache=True)
def _place(g, c, m, row_of, col_of, box_of, rows, cols, boxes):  # pragma: no cover - numba
    d = 0
    while not (m >> d) & 1:
        d += 1
    g[c] = d + 1
    rows[row_of[c]] |= m
    cols[col_of[c]] |= m
    boxes[box_of[c]] |= m


@njit(cache=True)
def _propagate(g, n, units, row_of, col_of, box_of, rows, cols, boxes):  # pragma: no cover - numba
    """Naked and hidden singles until nothing changes: 1 solved, 0 stuck, -1 contradiction."""
    full = (1 << n) - 1
    while True:
        changed = False
        empty = 0
        for c in range(g.shape[0]):
            if g[c] == 0:
                m = full & ~(rows[row_of[c]] | cols[col_of[c]] | boxes[box_of[c]])
                if m == 0:
                    return -1
                if m & (m - 1) == 0:
                    _place(g, c, m, row_of, col_of, box_of, rows, cols, boxes)
                    changed = True
                else:
                    empty += 1
        if empty == 0:
            return 1
        for u in range(units.shape[0]):
            once = 0
            twice = 0
            placed = 0
            for k in range(n):
                c = units[u, k]
                if g[c]:
                    placed |= 1 << (g[c] - 1)
                else:
                    m = full & ~(rows[row_of[c]] | cols[col_of[c]] | boxes[box_of[c]])
                    twice |= once & m
                    once |= m
            if (once | placed) != full:
                return -1  # a digit has no place left in this unit
            single = once & ~twice & ~placed
            if single:
                for k in range(n):
                    c = units[u, k]
                    if g[c] == 0:
                        m = full & ~(rows[row_of[c]] | cols[col_of[c]] | boxes[box_of[c]]) & single
                        if m:
                            if m & (m - 1):
                                return -1  # two digits that must both go into this one cell
                            _place(g, c, m, row_of, col_of, box_of, rows, cols, boxes)
                            changed = True
        if not changed:
            return 0


@njit(cache=True)
def _search(
    puzzle, n, units, row_of, col_of, box_of, popcount, limit, cell_order, digit_order, out
):  # pragma: no cover - numba
    """Count solutions up to ``limit``, writing the first ``len(out)`` into ``out``; returns (count, guesses)."""
    ncell = n * n
    g = puzzle.copy()
    rows = np.zeros(n, np.int32)
    cols = np.zeros(n, np.int32)
    boxes = np.zeros(n, np.int32)
    if not _fill_masks(g, row_of, col_of, box_of, rows, cols, boxes):
        return 0, 0
    full = (1 << n) - 1
    stack_g = np.empty((ncell + 1, ncell), np.int8)
    stack_cell = np.empty(ncell + 1, np.int32)
    stack_mask = np.empty(ncell + 1, np.int32)
    depth = 0
    count = 0
    guesses = 0
    while True:
        status = _propagate(g, n, units, row_of, col_of, box_of, rows, cols, boxes)
        if status == 1:
            if count < out.shape[0]:
                out[count, :] = g
            count += 1
            if count >= limit:
                break
        elif status == 0:
            best, best_k, best_m = -1, 99, 0
            for i in range(ncell):
                c = cell_order[i]
                if g[c] == 0:
                    m = full & ~(rows[row_of[c]] | cols[col_of[c]] | boxes[box_of[c]])
                    k = popcount[m]
                    if k < best_k:
                        best, best_k, best_m = c, k, m
                        if k == 2:
                            break
            stack_g[depth, :] = g
            stack_cell[depth] = best
            stack_mask[depth] = best_m
            depth += 1
        # Next trial: the next untried digit of the deepest branch point that has one left.
        while depth > 0 and stack_mask[depth - 1] == 0:
            depth -= 1
        if depth == 0:
            break
        top = depth - 1
        digit = 0
        for k in range(n):
            if stack_mask[top] & (1 << (digit_order[k] - 1)):
                digit = digit_order[k]
                break
        stack_mask[top] &= ~(1 << (digit - 1))
        g[:] = stack_g[top]
        g[stack_cell[top]] = digit
        _fill_masks(g, row_of, col_of, box_of, rows, cols, boxes)
        guesses += 1
    return count, guesses


@njit(cache=True)
def _search_many(
    puzzles, n, units, row_of, col_of, box_of, popcount, limit, order, digits
):  # pragma: no cover
    """:func:`_search` over a batch: counts, guesses and first solutions."""
    b = puzzles.shape[0]
    counts = np.zeros(b, np.int32)
    guesses = np.zeros(b, np.int64)
    solutions = np.zeros(puzzles.shape, np.int8)
    out = np.zeros((1, puzzles.shape[1]), np.int8)
    for i in range(b):
        out[0, :] = 0
        counts[i], guesses[i] = _search(
            puzzles[i], n, units, row_of, col_of, box_of, popcount, limit, order, digits, out
        )
        solutions[i] = out[0]
    return counts, guesses, solutions


@njit(cache=True)
def _minimize(
    solution, removal, n, units, row_of, col_of, box_of, popcount, order, digits
):  # pragma: no cover
    """Blank the cells of ``solution`` in ``removal`` order, keeping each blank only if the solution stays unique."""
    p = solution.copy()
    out = np.zeros((1, p.shape[0]), np.int8)
    for i in range(removal.shape[0]):
        c = removal[i]
        d = p[c]
        p[c] = 0
        count, _ = _search(p, n, units, row_of, col_of, box_of, popcount, 2, order, digits, out)
        if count != 1:
            p[c] = d
    return p


# ----------------------------------------------------------------------------------------------------------
# Python API
# ----------------------------------------------------------------------------------------------------------


@dataclass
class SolveResult:
    """What the exact solver found: ``count`` is capped at the limit it was given."""

    count: int
    guesses: int
    solutions: list[np.ndarray]

    @property
    def solution(self) -> np.ndarray | None:
        """The first solution found, or None."""
        return self.solutions[0] if self.solutions else None


def _box_of_grid(grid: np.ndarray, box: tuple[int, int] | None) -> tuple[int, int]:
    n = grid.shape[0]
    if box is None:
        if n not in BOX_FOR_SIZE:
            raise UsageError(f"no default box shape for a {n}x{n} Sudoku")
        box = BOX_FOR_SIZE[n]
    if box[0] * box[1] != n or grid.shape != (n, n):
        raise UsageError(f"grid of shape {grid.shape} does not fit boxes of {box[0]}x{box[1]}")
    return box


def _kernel_args(geo: Geometry) -> tuple[Any, ...]:
    return (geo.n, geo.units, geo.row_of, geo.col_of, geo.box_of, geo.popcount)


def _identity_orders(geo: Geometry) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(geo.n * geo.n, dtype=np.int32), np.arange(1, geo.n + 1, dtype=np.int32)


def solve(
    puzzle: np.ndarray, limit: int = 2, keep: int = 1, box: tuple[int, int] | None = None
) -> SolveResult:
    """Solve ``puzzle`` exactly, counting solutions up to ``limit`` and keeping the first ``keep`` of them."""
    grid = np.asarray(puzzle, dtype=np.int8)
    geo = geometry(*_box_of_grid(grid, box))
    out = np.zeros((max(keep, 1), geo.n * geo.n), np.int8)
    order, digits = _identity_orders(geo)
    count, guesses = _search(grid.ravel(), *_kernel_args(geo), max(limit, 1), order, digits, out)
    found = [out[i].reshape(geo.n, geo.n).copy() for i in range(min(count, keep))]
    return SolveResult(int(count), int(guesses), found)


def solve_many(puzzles: np.ndarray, limit: int = 2, box: tuple[int, int] | None = None) -> SolveResult:
    """Solve a batch ``[B, N, N]`` in one kernel call; ``count``/``guesses`` are arrays, ``solutions`` [B, N, N]."""
    grids = np.ascontiguousarray(puzzles, dtype=np.int8)
    geo = geometry(*_box_of_grid(grids[0], box))
    order, digits = _identity_orders(geo)
    flat = grids.reshape(len(grids), -1)
    counts, guesses, sols = _search_many(flat, *_kernel_args(geo), limit, order, digits)
    return SolveResult(counts, guesses, list(sols.reshape(grids.shape)))  # type: ignore[arg-type]


def rate(puzzle: np.ndarray, box: tuple[int, int] | None = None) -> int:
    """The difficulty rating of ``puzzle``: the solver's guesses while proving the solution unique."""
    return solve(puzzle, limit=2, box=box).guesses


def count_violations(puzzle: np.ndarray, answer: np.ndarray, box: tuple[int, int] = (3, 3)) -> int:
    """Missing digits summed over every row, column and box, plus givens of ``puzzle`` that ``answer`` changed."""
    geo = geometry(*box)
    flat_p, flat_a = np.asarray(puzzle).ravel(), np.asarray(answer).ravel()
    missing = 0
    for cells in geo.units:
        values = flat_a[cells]
        missing += geo.n - len(np.unique(values[(values >= 1) & (values <= geo.n)]))
    changed = int(((flat_p > 0) & (flat_p != flat_a)).sum())
    return missing + changed
