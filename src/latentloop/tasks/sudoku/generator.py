"""Rated Sudoku generation (random complete grids, minimal puzzles, difficulty tiers) and augmentation."""

from __future__ import annotations

import numpy as np

from latentloop.errors import UsageError
from latentloop.tasks.sudoku.solver import _identity_orders, _kernel_args, _minimize, _search, geometry, rate

#: Minimum and maximum rating (guesses) of each generator tier; ``None`` is unbounded.
TIERS: dict[str, tuple[int, int | None]] = {
    "easy": (0, 0),
    "medium": (1, 4),
    "hard": (5, 19),
    "extreme": (20, None),
}


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
