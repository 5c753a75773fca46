"""Sudoku benchmark: exact solver vs plain recursive backtracking, generator throughput and ratings per tier.

Prints one JSON object. Both solvers do the same job on the same generated extreme-tier puzzles: find the
solution and prove it unique (count solutions up to 2). Run::

    nice -n 19 .venv/bin/python benchmarks/sudoku_solver.py            # 1,000 extreme puzzles
    nice -n 19 .venv/bin/python benchmarks/sudoku_solver.py --quick    # a smaller run
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import numpy as np

from latentloop.errors import ArgumentParser
from latentloop.tasks import sudoku as S


def plain_count(grid: np.ndarray, limit: int = 2) -> tuple[int, list[int] | None]:
    """Plain recursive backtracking: the first empty cell, digits 1..9, scan row/column/box for each try."""
    cells = [int(v) for v in np.asarray(grid).ravel()]
    count = 0
    first: list[int] | None = None

    def allowed(i: int, d: int) -> bool:
        r, c = divmod(i, 9)
        br, bc = 3 * (r // 3), 3 * (c // 3)
        for k in range(9):
            if cells[9 * r + k] == d or cells[9 * k + c] == d or cells[9 * (br + k // 3) + bc + k % 3] == d:
                return False
        return True

    def recurse(i: int) -> bool:
        nonlocal count, first
        while i < 81 and cells[i]:
            i += 1
        if i == 81:
            count += 1
            first = first or list(cells)
            return count >= limit
        for d in range(1, 10):
            if allowed(i, d):
                cells[i] = d
                if recurse(i + 1):
                    return True
                cells[i] = 0
        return False

    recurse(0)
    return count, first


def _stats(values: list[int]) -> dict[str, float]:
    a = np.asarray(values)
    return {
        "count": len(a),
        "min": int(a.min()),
        "p25": float(np.percentile(a, 25)),
        "median": float(np.median(a)),
        "mean": round(float(a.mean()), 2),
        "p75": float(np.percentile(a, 75)),
        "p90": float(np.percentile(a, 90)),
        "max": int(a.max()),
    }


def _histogram(values: list[int]) -> dict[str, int]:
    edges = [0, 1, 2, 5, 10, 20, 30, 50, 100, 10**9]
    counts, _ = np.histogram(values, bins=edges)
    names = [
        f"{lo}" if hi - lo == 1 else (f"{lo}+" if hi == 10**9 else f"{lo}-{hi - 1}")
        for lo, hi in itertools.pairwise(edges)
    ]
    return {name: int(c) for name, c in zip(names, counts, strict=True)}


def _generate(tier: str, count: int, rng: np.random.Generator) -> tuple[list, float]:
    start = time.perf_counter()
    made = [S.generate(rng, tier=tier) for _ in range(count)]
    return made, time.perf_counter() - start


def _parser() -> ArgumentParser:
    """The command line of :func:`main`."""
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="extreme-tier puzzles for the exact solver")
    parser.add_argument(
        "--baseline-count", type=int, default=50, help="of those, how many the plain solver runs"
    )
    parser.add_argument(
        "--per-tier", type=int, default=200, help="puzzles generated per easy/medium/hard tier"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed passes of the exact solver (best is kept)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 puzzles, 10 for the baseline, 30 per tier")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    if args.quick:
        args.count, args.baseline_count, args.per_tier = 100, 10, 30
    rng = np.random.default_rng(args.seed)
    S.solve(S.generate(np.random.default_rng(0), tier="easy")[0])  # compile or load the numba kernels first

    extreme, extreme_seconds = _generate("extreme", args.count, rng)
    puzzles = np.stack([p for p, _, _ in extreme])

    # Exact solver through the public per-puzzle API (what `latentloop solve` and the generator use) ...
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        results = [S.solve(p, limit=2) for p in puzzles]
        best = min(best, time.perf_counter() - start)
    exact_rate = len(puzzles) / best
    assert all(r.count == 1 for r in results)
    # ... and as one batched kernel call.
    best_batch = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        batch = S.solve_many(puzzles, limit=2)
        best_batch = min(best_batch, time.perf_counter() - start)

    sample = puzzles[: args.baseline_count]
    start = time.perf_counter()
    plain = [plain_count(p) for p in sample]
    plain_seconds = time.perf_counter() - start
    plain_rate = len(sample) / plain_seconds
    agree = all(
        c == 1 and first == results[i].solution.ravel().tolist() for i, (c, first) in enumerate(plain)
    )

    tiers: dict[str, dict] = {}
    for tier in ("easy", "medium", "hard"):
        made, seconds = _generate(tier, args.per_tier, rng)
        ratings = [r for _, _, r in made]
        tiers[tier] = {
            "rating_range": list(S.TIERS[tier]),
            "puzzles_per_s": round(len(made) / seconds, 2),
            "ratings": _stats(ratings),
            "histogram": _histogram(ratings),
        }
    ratings = [r for _, _, r in extreme]
    tiers["extreme"] = {
        "rating_range": list(S.TIERS["extreme"]),
        "puzzles_per_s": round(len(extreme) / extreme_seconds, 2),
        "ratings": _stats(ratings),
        "histogram": _histogram(ratings),
    }
    clues = (puzzles > 0).sum(axis=(1, 2))
    report = {
        "benchmark": "sudoku_solver",
        "puzzles": len(puzzles),
        "tier": "extreme",
        "mean_clues": round(float(clues.mean()), 2),
        "exact_solver": {
            "puzzles_per_s": round(exact_rate, 1),
            "batched_puzzles_per_s": round(len(puzzles) / best_batch, 1),
            "mean_guesses": round(float(np.mean(batch.guesses)), 2),
        },
        "plain_backtracking": {
            "puzzles": len(sample),
            "puzzles_per_s": round(plain_rate, 2),
            "seconds": round(plain_seconds, 2),
            "same_solutions": agree,
        },
        "speedup": round(exact_rate / plain_rate, 1),
        "speedup_batched": round(len(puzzles) / best_batch / plain_rate, 1),
        "target_speedup": 20,
        "generator": tiers,
    }
    json.dump(report, sys.stdout, indent=1)
    print()
    return report


if __name__ == "__main__":
    main()
