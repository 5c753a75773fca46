"""Sudoku: text forms, an exact counting solver, a rated generator, Sudoku-Extreme CSV loading, augmentation.

Grids are ``np.int8`` arrays of shape ``(N, N)`` with ``N = box_rows * box_cols`` and 0 for a blank.

Token ids (see :class:`SudokuTask`): 0 = pad, 1 = blank, ``d + 1`` = digit ``d`` (so ``N + 2`` tokens).

The modules: :mod:`~latentloop.tasks.sudoku.solver` (the rules, the numba kernels and the exact solver whose
guesses rate a puzzle's difficulty), :mod:`~latentloop.tasks.sudoku.generator` (rated puzzles, augmentation),
:mod:`~latentloop.tasks.sudoku.io` (text forms, Sudoku-Extreme CSV files) and
:mod:`~latentloop.tasks.sudoku.task` (:class:`SudokuTask`). Their public names are all importable from here.
"""

from latentloop.tasks.sudoku.generator import (
    TIERS,
    TierStats,
    add_clues,
    augment,
    candidate,
    generate,
    minimal_puzzle,
    random_solution,
    tier_bounds,
    tier_stats,
)
from latentloop.tasks.sudoku.io import SudokuTable, find_clash, format_grid, load_sudoku_csv, parse_grid
from latentloop.tasks.sudoku.solver import (
    BOX_FOR_SIZE,
    Geometry,
    SolveResult,
    count_violations,
    geometry,
    rate,
    solve,
    solve_many,
)
from latentloop.tasks.sudoku.task import BLANK, PAD, SudokuTask

__all__ = [
    "BLANK",
    "BOX_FOR_SIZE",
    "PAD",
    "TIERS",
    "Geometry",
    "SolveResult",
    "SudokuTable",
    "SudokuTask",
    "TierStats",
    "add_clues",
    "augment",
    "candidate",
    "count_violations",
    "find_clash",
    "format_grid",
    "generate",
    "geometry",
    "load_sudoku_csv",
    "minimal_puzzle",
    "parse_grid",
    "random_solution",
    "rate",
    "solve",
    "solve_many",
    "tier_bounds",
    "tier_stats",
]
