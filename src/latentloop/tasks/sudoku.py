"""Sudoku: text forms, an exact counting solver, a rated generator, Sudoku-Extreme CSV loading, augmentation.

Grids are ``np.int8`` arrays of shape ``(N, N)`` with ``N = box_rows * box_cols`` and 0 for a blank.

Token ids (see :class:`SudokuTask`): 0 = pad, 1 = blank, ``d + 1`` = digit ``d`` (so ``N + 2`` tokens).

The solver is a numba kernel: digits as bit masks per row, column and box, naked and hidden singles until
nothing changes, then a guess on the cell with the fewest candidates, with an explicit stack instead of
recursion. Its *guesses* (every trial placement at a branch point, while counting up to the limit) are the
difficulty rating, like the backtrack count of tdoku that rates Sudoku-Extreme.
"""

from __future__ import annotations

import csv
import functools
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from latentloop.errors import UsageError
from latentloop.tasks.base import Task

PAD, BLANK = 0, 1
#: Minimum and maximum rating (guesses) of each generator tier; ``None`` is unbounded.
TIERS: dict[str, tuple[int, int | None]] = {
    "easy": (0, 0),
    "medium": (1, 4),
    "hard": (5, 19),
    "extreme": (20, None),
}
BOX_FOR_SIZE = {4: (2, 2), 6: (2, 3), 8: (2, 4), 9: (3, 3)}
_BLANK_CHARS = ".0_"
_SEPARATORS = re.compile(r"[\s|+\-]")


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


def random_solution(rng: np.random.Generator, box: tuple[int, int] = (3, 3)) -> np.ndarray:
    """A random complete grid: the solver fills an empty grid in a random cell and digit order, then shuffles."""
    geo = geometry(*box)
    order = rng.permutation(geo.n * geo.n).astype(np.int32)
    digits = (rng.permutation(geo.n) + 1).astype(np.int32)
    out = np.zeros((1, geo.n * geo.n), np.int8)
    _search(np.zeros(geo.n * geo.n, np.int8), *_kernel_args(geo), 1, order, digits, out)
    grid = out[0].reshape(geo.n, geo.n)
    return augment(grid, grid, rng, box)[1]


def minimal_puzzle(
    solution: np.ndarray, rng: np.random.Generator, box: tuple[int, int] = (3, 3)
) -> np.ndarray:
    """Remove clues of ``solution`` in random order while the solution stays unique (a minimal puzzle)."""
    geo = geometry(*box)
    order, digits = _identity_orders(geo)
    removal = rng.permutation(geo.n * geo.n).astype(np.int32)
    flat = np.ascontiguousarray(solution, dtype=np.int8).ravel()
    return _minimize(flat, removal, *_kernel_args(geo), order, digits).reshape(geo.n, geo.n)


def tier_bounds(tier: str | None, min_rating: int | None = None, max_rating: int | None = None):
    """The rating range ``(low, high)`` of ``tier``, with explicit bounds taking precedence."""
    low, high = TIERS[tier] if tier else (0, None)
    return (low if min_rating is None else min_rating), (high if max_rating is None else max_rating)


def generate(
    rng: np.random.Generator,
    box: tuple[int, int] = (3, 3),
    tier: str | None = None,
    min_rating: int | None = None,
    max_rating: int | None = None,
    max_candidates: int = 20_000,
) -> tuple[np.ndarray, np.ndarray, int]:
    """One puzzle with a unique solution and a rating in the tier's range: ``(puzzle, solution, rating)``.

    Candidates (random grid, then a minimal puzzle) are made and rated until one fits, so harder tiers
    cost more candidates per puzzle (about 1 in 30 is "extreme" on 9x9).
    """
    low, high = tier_bounds(tier, min_rating, max_rating)
    for _ in range(max_candidates):
        solution = random_solution(rng, box)
        puzzle = minimal_puzzle(solution, rng, box)
        rating = rate(puzzle, box)
        if rating >= low and (high is None or rating <= high):
            return puzzle, solution, rating
    n = box[0] * box[1]
    raise UsageError(
        f"no {n}x{n} puzzle rated {low}..{'' if high is None else high} in {max_candidates} candidates; "
        "choose an easier tier or a wider rating range"
    )


def augment(
    puzzle: np.ndarray, solution: np.ndarray, rng: np.random.Generator, box: tuple[int, int] = (3, 3)
) -> tuple[np.ndarray, np.ndarray]:
    """The same random validity-preserving shuffle applied to a puzzle and its solution.

    Digits are relabelled; bands (rows of boxes) and the rows inside each band are permuted, likewise stacks
    and columns; square boxes also allow a transpose.
    """
    br, bc = box
    n = br * bc
    rows = np.concatenate([band * br + rng.permutation(br) for band in rng.permutation(n // br)])
    cols = np.concatenate([stack * bc + rng.permutation(bc) for stack in rng.permutation(n // bc)])
    digits = np.concatenate([[0], rng.permutation(n) + 1]).astype(np.int8)
    transpose = br == bc and bool(rng.integers(2))

    def apply(grid: np.ndarray) -> np.ndarray:
        out = digits[np.asarray(grid)[np.ix_(rows, cols)]]
        return np.ascontiguousarray(out.T if transpose else out)

    return apply(puzzle), apply(solution)


# ----------------------------------------------------------------------------------------------------------
# Text forms and checks
# ----------------------------------------------------------------------------------------------------------


def parse_grid(text: str, box: tuple[int, int] = (3, 3), check_givens: bool = True) -> np.ndarray:
    """A grid from text: N*N cells, '.', '0' or '_' for blanks; whitespace and '|', '-', '+' are ignored."""
    n = box[0] * box[1]
    cells = _SEPARATORS.sub("", text)
    if len(cells) != n * n:
        raise UsageError(f"a {n}x{n} Sudoku needs {n * n} cells, got {len(cells)}")
    allowed = set(_BLANK_CHARS) | {str(d) for d in range(1, n + 1)}
    bad = sorted(set(cells) - allowed)
    if bad:
        raise UsageError(
            f"unexpected character {bad[0]!r} in a {n}x{n} Sudoku (digits 1-{n}, '.', '0' or '_')"
        )
    grid = np.array([0 if ch in _BLANK_CHARS else int(ch) for ch in cells], dtype=np.int8).reshape(n, n)
    if check_givens:
        clash = find_clash(grid, box)
        if clash:
            raise UsageError(f"the givens clash: {clash}")
    return grid


def find_clash(grid: np.ndarray, box: tuple[int, int] = (3, 3)) -> str | None:
    """A description of the first repeated digit in a row, column or box, or None."""
    geo = geometry(*box)
    flat = np.asarray(grid).ravel()
    for u, cells in enumerate(geo.units):
        values = flat[cells][flat[cells] > 0]
        uniq, counts = np.unique(values, return_counts=True)
        if (counts > 1).any():
            kind = ("row", "column", "box")[u // geo.n]
            return f"digit {uniq[counts > 1][0]} twice in {kind} {u % geo.n + 1}"
    return None


def format_grid(grid: np.ndarray, pretty: bool = False, box: tuple[int, int] | None = None) -> str:
    """One line of N*N characters with '.' for blanks, or (``pretty``) rows with box separators."""
    grid = np.asarray(grid)
    chars = [["." if v == 0 else str(int(v)) for v in row] for row in grid]
    if not pretty:
        return "".join("".join(row) for row in chars)
    br, bc = _box_of_grid(grid, box)
    lines = []
    for r, row in enumerate(chars):
        if r and r % br == 0:
            lines.append("-+-".join("-" * (2 * bc - 1) for _ in range(len(row) // bc)))
        lines.append(" | ".join(" ".join(row[s : s + bc]) for s in range(0, len(row), bc)))
    return "\n".join(lines)


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


@dataclass
class SudokuTable:
    """The rows of a Sudoku-Extreme CSV as arrays (the real file has millions of rows)."""

    sources: list[str]
    puzzles: np.ndarray  # [N, 9, 9] int8, 0 = blank
    solutions: np.ndarray  # [N, 9, 9]
    ratings: np.ndarray  # [N]

    def __len__(self) -> int:
        return len(self.ratings)


def _grids(cells: list[str], lines: list[int], path: Path, column: str) -> np.ndarray:
    """``[N, 9, 9]`` grids from 81-character strings, checked all at once; errors name the CSV line."""
    raw = np.frombuffer("".join(cells).encode("ascii", "replace"), dtype=np.uint8).reshape(-1, 81)
    digits = (raw >= ord("1")) & (raw <= ord("9"))
    ok = digits | np.isin(raw, np.frombuffer(_BLANK_CHARS.encode(), np.uint8))
    if not ok.all():
        row = int(np.nonzero(~ok.all(axis=1))[0][0])
        try:
            parse_grid(cells[row], check_givens=False)
        except UsageError as error:
            raise UsageError(f"{path}:{lines[row]}: {error}") from None
    grids = np.where(digits, raw - ord("0"), 0).astype(np.int8).reshape(-1, 9, 9)
    if column == "q":  # givens must not clash: sort each unit and look for equal neighbours
        units = geometry(3, 3).units
        values = np.sort(grids.reshape(-1, 81)[:, units], axis=2)
        clash = ((values[:, :, 1:] == values[:, :, :-1]) & (values[:, :, 1:] > 0)).any(axis=(1, 2))
        if clash.any():
            row = int(np.nonzero(clash)[0][0])
            raise UsageError(f"{path}:{lines[row]}: the givens clash: {find_clash(grids[row])}")
    return grids


def load_sudoku_csv(path: str | Path) -> SudokuTable:
    """Read a Sudoku-Extreme CSV (header ``source,q,a,rating``; '.' for blanks) from a local file."""
    path = Path(path)
    sources: list[str] = []
    questions: list[str] = []
    answers: list[str] = []
    ratings: list[int] = []
    lines: list[int] = []
    try:
        with open(path, newline="") as stream:
            reader = csv.reader(stream)
            header = next(reader, None)
            if header is None or [h.strip() for h in header[:4]] != ["source", "q", "a", "rating"]:
                raise UsageError(f"{path}: expected the header 'source,q,a,rating', got {header!r}")
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) < 4:
                    raise UsageError(f"{path}:{line}: expected 4 columns, got {len(row)}")
                for cells in (row[1], row[2]):
                    if len(cells) != 81:
                        raise UsageError(f"{path}:{line}: a 9x9 Sudoku needs 81 cells, got {len(cells)}")
                try:
                    ratings.append(int(row[3]))
                except ValueError:
                    raise UsageError(f"{path}:{line}: the rating {row[3]!r} is not an integer") from None
                sources.append(row[0])
                questions.append(row[1])
                answers.append(row[2])
                lines.append(line)
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text CSV file") from None
    except csv.Error as error:
        raise UsageError(f"{path}: malformed CSV: {error}") from None
    if not ratings:
        return SudokuTable(
            [], np.zeros((0, 9, 9), np.int8), np.zeros((0, 9, 9), np.int8), np.zeros(0, np.int64)
        )
    puzzles = _grids(questions, lines, path, "q")
    solutions = _grids(answers, lines, path, "a")
    return SudokuTable(sources, puzzles, solutions, np.asarray(ratings, dtype=np.int64))


# ----------------------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------------------


def _parse_int(name: str, value: Any, minimum: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"option {name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"option {name} must be at least {minimum}, got {number}")
    return number


def _parse_box(box: Any, n: Any) -> tuple[int, int]:
    if box is not None:
        match = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", str(box))
        if not match or not 1 <= int(match[1]) * int(match[2]) <= 9 or min(int(match[1]), int(match[2])) < 1:
            raise UsageError(
                f"option box must look like 3x3 or 2x3 with at most 9 cells per box, got {box!r}"
            )
        return int(match[1]), int(match[2])
    side = _parse_int("n", n if n is not None else 9, 1)
    if side not in BOX_FOR_SIZE:
        raise UsageError(
            f"option n (grid side) must be one of {sorted(BOX_FOR_SIZE)}, got {side} (or give box=RxC)"
        )
    return BOX_FOR_SIZE[side]


class SudokuTask(Task):
    """Sudoku puzzles (``N x N``, boxes ``box_rows x box_cols``): generated by tier, or read from a CSV.

    Options (strings accepted): ``box`` ("3x3", "2x2", "2x3"...) or ``n`` (grid side 4, 6, 8, 9); ``tier`` (easy,
    medium, hard, extreme) or ``min_rating``/``max_rating``; ``augment`` (shuffled copies added per training
    puzzle); ``data`` (a Sudoku-Extreme CSV file, split 85:15, or a folder with ``train.csv``/``test.csv``);
    ``unconditional`` (true: every puzzle is the empty grid and its label a random complete board, for
    unconditional generation; any valid board is a right answer).
    The default tier is "extreme" for generated 9x9 puzzles, otherwise "any" (every rating).
    Tokens: 0 = pad, 1 = blank, ``d + 1`` = digit ``d``.
    """

    name = "sudoku"

    def __init__(
        self,
        box: str | None = None,
        n: int | str | None = None,
        tier: str | None = None,
        min_rating: int | str | None = None,
        max_rating: int | str | None = None,
        augment: int | str = 0,
        data: str | None = None,
        unconditional: bool | str = False,
    ) -> None:
        self.box = _parse_box(box, n)
        if str(unconditional).lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise UsageError(f"option unconditional must be true or false, got {unconditional!r}")
        self.unconditional = str(unconditional).lower() in ("1", "true", "yes")
        self.n = self.box[0] * self.box[1]
        if tier in (None, "") and min_rating is None and max_rating is None:
            # Small grids never need many guesses; a CSV keeps all its rows unless asked otherwise.
            tier = "extreme" if self.n == 9 and not data else None
        if tier in ("any", ""):
            tier = None
        if tier is not None and tier not in TIERS:
            raise UsageError(f"option tier must be one of {', '.join(TIERS)} or any, got {tier!r}")
        self.tier = tier
        low = None if min_rating is None else _parse_int("min_rating", min_rating)
        high = None if max_rating is None else _parse_int("max_rating", max_rating)
        self.rating_range = tier_bounds(tier, low, high)
        self.augment = _parse_int("augment", augment)
        self.data = Path(data) if data else None
        if self.data is not None:
            if self.n != 9:
                raise UsageError("option data (a Sudoku-Extreme CSV) holds 9x9 puzzles only")
            if not self.data.exists():
                raise UsageError(f"option data: no such file or folder {str(self.data)!r}")
        self.vocab_size = self.n + 2
        self.seq_len = self.n * self.n
        self.endless = self.data is None

    # -- examples --------------------------------------------------------------------------------------
    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Generated ``(puzzle, solution)`` pairs (an endless stream; train and test use separate streams), or
        the pairs of the CSV given as ``data``."""
        for puzzle, solution, _ in self.rated_examples(split, seed):
            yield puzzle, solution

    def rated_examples(self, split: str, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """Like :meth:`examples`, with each puzzle's rating."""
        split_id = _split_id(split)
        if self.unconditional:
            rng = np.random.default_rng([seed, split_id, 0xB1A])
            solutions = (s for _, s, _ in self._csv_examples(split, seed)) if self.data is not None else None
            while True:
                solution = next(solutions, None) if solutions is not None else random_solution(rng, self.box)
                if solution is None:
                    return
                yield self.blank(), solution, 0
        if self.data is not None:
            yield from self._csv_examples(split, seed)
            return
        rng = np.random.default_rng([seed, split_id])
        low, high = self.rating_range
        while True:
            yield generate(rng, self.box, min_rating=low, max_rating=high)

    def _csv_examples(self, split: str, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        assert self.data is not None
        if self.data.is_dir():
            table = load_sudoku_csv(self.data / f"{split}.csv")
            chosen = np.arange(len(table))
        else:
            table = load_sudoku_csv(self.data)
            order = np.random.default_rng(seed).permutation(len(table))
            cut = round(len(table) * 0.85)
            chosen = order[:cut] if split == "train" else order[cut:]
        low, high = self.rating_range
        for i in chosen:
            rating = int(table.ratings[i])
            if rating >= low and (high is None or rating <= high):
                yield table.puzzles[i], table.solutions[i], rating

    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows ``(inputs, labels, puzzle_key, group_key, info)``; training puzzles get ``augment`` copies."""
        rng = np.random.default_rng([seed, _split_id(split), 7])
        for index, (puzzle, solution, rating) in enumerate(
            itertools.islice(self.rated_examples(split, seed), size)
        ):
            yield self.encode(puzzle), self.encode(solution), (index, 0), index, {"rating": rating}
            for copy in range(1, 1 + (self.augment if split == "train" else 0)):
                p, s = augment(puzzle, solution, rng, self.box)
                yield self.encode(p), self.encode(s), (index, copy), index, None

    def blank(self) -> np.ndarray:
        """The all-empty grid: its valid answers are all complete Sudoku boards (unconditional generation)."""
        return np.zeros((self.n, self.n), dtype=np.int8)

    # -- tokens and checks ------------------------------------------------------------------------------
    def encode(self, puzzle: np.ndarray) -> np.ndarray:
        """Tokens ``[N*N]``: 1 for a blank, ``d + 1`` for digit ``d``."""
        grid = np.asarray(puzzle)
        if grid.size != self.n * self.n or grid.min() < 0 or grid.max() > self.n:
            raise UsageError(f"not a {self.n}x{self.n} Sudoku grid")
        return (grid.reshape(-1) + 1).astype(np.uint8)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """The grid of ``tokens``; pad and out-of-range tokens become blanks."""
        tokens = np.asarray(tokens).reshape(self.n, self.n).astype(np.int16)
        return np.where((tokens >= 2) & (tokens <= self.n + 1), tokens - 1, 0).astype(np.int8)

    def verify(self, puzzle: np.ndarray, answer: np.ndarray) -> bool:
        """True when ``answer`` is a complete valid grid that keeps every given of ``puzzle``."""
        return self.violations(puzzle, answer) == 0

    def violations(self, puzzle: np.ndarray, answer: np.ndarray) -> int:
        """Missing digits over all rows, columns and boxes plus changed givens."""
        return count_violations(puzzle, answer, self.box)

    def solutions(self, puzzle: np.ndarray, limit: int | None = None) -> list[np.ndarray]:
        """Every solution (at most ``limit``; default 1000)."""
        limit = 1000 if limit is None else limit
        return solve(puzzle, limit=limit, keep=limit, box=self.box).solutions

    def solve(self, puzzle: np.ndarray, limit: int = 2, keep: int = 1) -> SolveResult:
        """The exact solver on ``puzzle`` (see :func:`solve`)."""
        return solve(puzzle, limit=limit, keep=keep, box=self.box)

    def parse(self, text: str) -> np.ndarray:
        """A puzzle from text; clashing givens are an error."""
        return parse_grid(text, self.box)

    def parse_answer(self, text: str, puzzle: np.ndarray | None = None) -> np.ndarray:
        """An answer from text; clashes are allowed (they make it invalid, not unreadable)."""
        return parse_grid(text, self.box, check_givens=False)

    def format(self, answer: np.ndarray, pretty: bool = False) -> str:
        """One line with '.' for blanks, or a boxed layout when ``pretty``."""
        return format_grid(answer, pretty, self.box)

    drawable = True

    def draw(self, ax: Any, puzzle: np.ndarray, answer: np.ndarray) -> None:
        """The grid: givens black, filled digits blue, digits repeated in a unit (or changed givens) red."""
        n, (box_rows, box_cols) = self.n, self.box
        grid, givens = np.asarray(answer).ravel(), np.asarray(puzzle).ravel()
        clash = np.zeros(n * n, dtype=bool)
        for cells in geometry(box_rows, box_cols).units:
            digits = grid[cells]
            counts = np.bincount(digits, minlength=n + 1)
            clash[cells[(digits > 0) & (counts[digits] > 1)]] = True
        clash |= (givens > 0) & (grid != givens)
        for cell in range(n * n):
            if grid[cell] > 0:
                color = "tab:red" if clash[cell] else ("black" if givens[cell] else "tab:blue")
                ax.text(
                    cell % n,
                    cell // n,
                    str(grid[cell]),
                    ha="center",
                    va="center",
                    color=color,
                    fontsize=80 / n,
                )
        for k in range(n + 1):
            ax.axhline(k - 0.5, color="black", lw=1.5 if k % box_rows == 0 else 0.3)
            ax.axvline(k - 0.5, color="black", lw=1.5 if k % box_cols == 0 else 0.3)
        ax.set(xlim=(-0.5, n - 0.5), ylim=(n - 0.5, -0.5), aspect="equal", xticks=[], yticks=[])

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task."""
        return {
            "box": list(self.box),
            "rating_range": list(self.rating_range),
            "tier": self.tier,
            "augment": self.augment,
            "tokens": {"pad": PAD, "blank": BLANK, "digit d": "d + 1"},
        }


def _split_id(split: str) -> int:
    if split not in ("train", "test"):
        raise UsageError(f"split must be 'train' or 'test', got {split!r}")
    return 0 if split == "train" else 1
