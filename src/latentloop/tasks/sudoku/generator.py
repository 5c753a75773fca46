"""Rated Sudoku generation (random complete grids, minimal puzzles, difficulty tiers) and augmentation."""

from __future__ import annotations

from dataclasses import dataclass

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


def candidate(
    rng: np.random.Generator, box: tuple[int, int] = (3, 3), clues: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(puzzle, solution)``: a random grid, a minimal puzzle of it, and givens added up to ``clues``."""
    solution = random_solution(rng, box)
    return add_clues(minimal_puzzle(solution, rng, box), solution, clues, rng), solution


def minimal_puzzle(
    solution: np.ndarray, rng: np.random.Generator, box: tuple[int, int] = (3, 3)
) -> np.ndarray:
    """Remove clues of ``solution`` in random order while the solution stays unique (a minimal puzzle)."""
    geo = geometry(*box)
    order, digits = _identity_orders(geo)
    removal = rng.permutation(geo.n * geo.n).astype(np.int32)
    flat = np.ascontiguousarray(solution, dtype=np.int8).ravel()
    return _minimize(flat, removal, *_kernel_args(geo), order, digits).reshape(geo.n, geo.n)


def add_clues(puzzle: np.ndarray, solution: np.ndarray, clues: int, rng: np.random.Generator) -> np.ndarray:
    """``puzzle`` with givens of ``solution`` added in random cells until it has ``clues`` of them (or as it is
    when it has as many already). A puzzle with one solution keeps it: givens only remove candidates."""
    out = np.array(puzzle, dtype=np.int8)
    flat, answer = out.reshape(-1), np.asarray(solution).reshape(-1)
    missing = clues - int((flat > 0).sum())
    if missing > 0:
        cells = rng.permutation(np.flatnonzero(flat == 0))[:missing]
        flat[cells] = answer[cells]
    return out


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
    clues: int = 0,
) -> tuple[np.ndarray, np.ndarray, int]:
    """One puzzle with a unique solution and a rating in the tier's range: ``(puzzle, solution, rating)``.

    Candidates (random grid, then a minimal puzzle, then random givens added up to ``clues``; 0 adds none) are
    made and rated until one fits, so harder tiers cost more candidates per puzzle (about 1 in 30 is
    "extreme" on 9x9).
    """
    low, high = tier_bounds(tier, min_rating, max_rating)
    for _ in range(max_candidates):
        puzzle, solution = candidate(rng, box, clues)
        rating = rate(puzzle, box)
        if rating >= low and (high is None or rating <= high):
            return puzzle, solution, rating
    n = box[0] * box[1]
    raise UsageError(
        f"no {n}x{n} puzzle rated {low}..{'' if high is None else high} in {max_candidates} candidates; "
        "choose an easier tier or a wider rating range"
    )


@dataclass
class TierStats:
    """What the generator's puzzles of one tier look like: the share of candidates that fall in it, and the
    ratings (guesses) and clue counts of those candidates."""

    tier: str
    bounds: tuple[int, int | None]
    candidates: int  # of the candidates drawn, how many fell in this tier
    share: float  # candidates / all candidates drawn
    ratings: tuple[int, int, float] | None  # min, max, median; None when no candidate fell in the tier
    clues: tuple[int, int, float] | None  # min, max, mean

    def line(self) -> str:
        """One line of a human report."""
        high = "" if self.bounds[1] is None else self.bounds[1]
        head = f"{self.tier:<8} rating {self.bounds[0]}..{high}: {self.share:6.1%} of candidates"
        if self.ratings is None or self.clues is None:
            return f"{head}, none drawn"
        (r_lo, r_hi, r_med), (c_lo, c_hi, c_mean) = self.ratings, self.clues
        return (
            f"{head} ({self.candidates}); ratings {r_lo}..{r_hi} (median {r_med:g}); "
            f"clues {c_lo}..{c_hi} (mean {c_mean:.1f})"
        )


def tier_stats(
    candidates: int = 1000,
    box: tuple[int, int] = (3, 3),
    seed: int = 0,
    tiers: dict[str, tuple[int, int | None]] | None = None,
    clues: int = 0,
) -> list[TierStats]:
    """Ratings and clue counts of the generator's puzzles per tier, from ``candidates`` candidates made as
    :func:`generate` makes them (:func:`candidate`, with ``clues``), each rated and put in its tier.

    :func:`generate` keeps the first candidate in the asked range, so a tier's puzzles are distributed as the
    candidates that fall in it: these statistics describe what a dataset of that tier holds.
    """
    rng = np.random.default_rng(seed)
    ratings, givens = np.empty(candidates, np.int64), np.empty(candidates, np.int64)
    for i in range(candidates):
        puzzle, _ = candidate(rng, box, clues)
        ratings[i], givens[i] = rate(puzzle, box), int((puzzle > 0).sum())
    out = []
    for name, (low, high) in (tiers or TIERS).items():
        inside = (ratings >= low) & (True if high is None else ratings <= high)
        r, c = ratings[inside], givens[inside]
        out.append(
            TierStats(
                tier=name,
                bounds=(low, high),
                candidates=int(inside.sum()),
                share=float(inside.mean()) if candidates else 0.0,
                ratings=(int(r.min()), int(r.max()), float(np.median(r))) if len(r) else None,
                clues=(int(c.min()), int(c.max()), float(c.mean())) if len(c) else None,
            )
        )
    return out


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
