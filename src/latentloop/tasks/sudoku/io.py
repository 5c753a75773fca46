"""Sudoku text forms and Sudoku-Extreme CSV loading."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latentloop.errors import UsageError
from latentloop.tasks.sudoku.solver import _box_of_grid, geometry

_BLANK_CHARS = ".0_"
_SEPARATORS = re.compile(r"[\s|+\-]")


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
