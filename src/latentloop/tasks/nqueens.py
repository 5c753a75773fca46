"""N-Queens as in GRAM: complete a board from which k queens were removed; every valid completion counts.

Boards are boolean arrays ``(n, n)`` (True = queen). Text form: ``n*n`` characters, 'Q' or '1' for a
queen, '.' or '0' for an empty cell; whitespace and the row separators '|' and '/' are ignored. Token ids:
0 = pad, 1 = empty, 2 = queen.

Dataset (GRAM protocol): every solution of the ``n x n`` board, every way of removing ``k`` of its queens
for each k (default {n-3, n-2, n-1}: {5, 6, 7} for 8x8, {7, 8, 9} for 10x10), deduplicated, split 85:15 by
unique input with a fixed seed; each input is stored once per valid completion, so coverage (distinct
valid answers found / all completions) can be measured.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from latentloop.data.augment import dihedral
from latentloop.errors import UsageError
from latentloop.tasks.base import ExactSolution, Task

PAD, EMPTY, QUEEN = 0, 1, 2
_QUEEN_CHARS, _EMPTY_CHARS = "Qq1", ".0"


def _attacked_by_givens(n: int, givens: list[tuple[int, int]]) -> list[int]:
    """Per row, the bit mask of columns that a given queen in another row attacks."""
    masks = [0] * n
    for row in range(n):
        for r, c in givens:
            if r != row:
                for col in (c, c + row - r, c - row + r):
                    if 0 <= col < n:
                        masks[row] |= 1 << col
    return masks


def enumerate_solutions(
    n: int, board: np.ndarray | None = None, limit: int | None = None
) -> list[tuple[int, ...]]:
    """Solutions (the queen's column in each row) of ``n``-queens that keep the queens of ``board``.

    Row-by-row backtracking over bit masks of attacked columns and diagonals; a given queen fixes its row.
    """
    givens = [] if board is None else [(int(r), int(c)) for r, c in np.argwhere(board)]
    forced = [-1] * n
    for r, c in givens:
        if forced[r] >= 0:
            return []  # two given queens in one row
        forced[r] = c
    blocked = _attacked_by_givens(n, givens)
    full = (1 << n) - 1
    cols = [0] * n
    found: list[tuple[int, ...]] = []
    cap = limit if limit is not None else float("inf")

    def place(row: int, used: int, diag1: int, diag2: int) -> bool:
        if row == n:
            found.append(tuple(cols))
            return len(found) >= cap
        free = full & ~(used | diag1 | diag2 | blocked[row])
        if forced[row] >= 0:
            free &= 1 << forced[row]
        while free:
            bit = free & -free
            free ^= bit
            cols[row] = bit.bit_length() - 1
            if place(row + 1, used | bit, ((diag1 | bit) << 1) & full, (diag2 | bit) >> 1):
                return True
        return False

    if n > 0:
        place(0, 0, 0, 0)
    return found


@functools.lru_cache(maxsize=16)
def all_solutions(n: int) -> np.ndarray:
    """Every solution of the empty ``n x n`` board as an array ``[S, n]`` of columns (cached)."""
    return np.array(enumerate_solutions(n), dtype=np.int16).reshape(-1, n)


def count_solutions(n: int) -> int:
    """The number of solutions of the empty ``n x n`` board."""
    return len(enumerate_solutions(n))


@functools.cache
def _solution_tokens(n: int) -> np.ndarray:
    """Every solution of the empty ``n x n`` board as queen/empty token rows ``[S, n*n]`` (int64)."""
    boards = np.stack([board_from_columns(columns) for columns in all_solutions(n)])
    return np.where(boards.reshape(len(boards), -1), QUEEN, EMPTY).astype(np.int64)


def board_from_columns(columns: tuple[int, ...] | np.ndarray) -> np.ndarray:
    """The boolean board with a queen at ``(row, columns[row])`` in every row."""
    n = len(columns)
    board = np.zeros((n, n), dtype=bool)
    board[np.arange(n), np.asarray(columns)] = True
    return board


def attacking_pairs(board: np.ndarray) -> int:
    """Pairs of queens that share a row, column or diagonal."""
    rows, cols = np.nonzero(board)
    pairs = 0
    for key in (rows, cols, rows - cols, rows + cols):
        _, counts = np.unique(key, return_counts=True)
        pairs += int((counts * (counts - 1) // 2).sum())
    return pairs


def parse_board(text: str, n: int | None = None) -> np.ndarray:
    """A board from its text form (see the module docstring); ``n`` is inferred from the length if None."""
    cells = re.sub(r"[\s|/]", "", text)
    size = n if n is not None else round(len(cells) ** 0.5)
    if size < 1 or len(cells) != size * size:
        need = (
            f"{size * size} cells for {size}x{size} (option n sets the size)"
            if n is not None
            else "a square number of cells (n x n; option n sets n)"
        )
        raise UsageError(f"an N-Queens board needs {need}, got {len(cells)}")
    bad = sorted(set(cells) - set(_QUEEN_CHARS + _EMPTY_CHARS))
    if bad:
        raise UsageError(
            f"unexpected character {bad[0]!r} in an N-Queens board ('Q' or '1' queen, '.' or '0' empty)"
        )
    return np.array([ch in _QUEEN_CHARS for ch in cells], dtype=bool).reshape(size, size)


def format_board(board: np.ndarray, pretty: bool = False) -> str:
    """``n*n`` characters 'Q'/'.' on one line, or ``n`` lines when ``pretty``."""
    rows = ["".join("Q" if q else "." for q in row) for row in np.asarray(board)]
    return "\n".join(rows) if pretty else "".join(rows)


def _int_list(name: str, value: Any) -> list[int]:
    items = value if isinstance(value, (list, tuple)) else str(value).replace(";", ",").split(",")
    try:
        return sorted({int(v) for v in items if str(v).strip()})
    except ValueError:
        raise UsageError(f"option {name} must be integers separated by commas, got {value!r}") from None


class NQueensTask(Task):
    """``n x n`` N-Queens completion. Options: ``n`` (default 8; a board read without it takes its size from
    its square number of cells), ``k`` (queens removed, e.g. "5,6,7").

    Tokens: 0 = pad, 1 = empty, 2 = queen; inputs and labels are ``n*n`` long.
    """

    name = "nqueens"
    multi_solution = True
    drawable = True
    lists_completions = True

    def __init__(self, n: int | str | None = None, k: str | list[int] | None = None) -> None:
        self.n_given = n is not None
        try:
            self.n = int(8 if n is None else n)
        except (TypeError, ValueError):
            raise UsageError(f"option n must be an integer, got {n!r}") from None
        if not 1 <= self.n <= 14:
            raise UsageError(f"option n must be between 1 and 14, got {self.n}")
        self.k = (
            _int_list("k", k)
            if k is not None
            else [m for m in (self.n - 3, self.n - 2, self.n - 1) if m >= 1]
        )
        if not self.k or any(not 1 <= m <= self.n for m in self.k):
            raise UsageError(f"option k must list numbers of queens to remove in 1..{self.n}, got {k!r}")
        self.vocab_size = 3
        self.seq_len = self.n * self.n

    # -- the GRAM dataset -------------------------------------------------------------------------------
    def split_inputs(self, split: str, seed: int = 0) -> list[np.ndarray]:
        """The unique inputs of ``split`` (rows of ``[n]`` columns, -1 where a queen was removed)."""
        if split not in ("train", "test"):
            raise UsageError(f"split must be 'train' or 'test', got {split!r}")
        inputs = set()
        for columns in all_solutions(self.n):
            for k in self.k:
                for removed in itertools.combinations(range(self.n), k):
                    kept = columns.copy()
                    kept[list(removed)] = -1
                    inputs.add(tuple(int(c) for c in kept))
        ordered = sorted(inputs)
        order = np.random.default_rng(seed).permutation(len(ordered))
        cut = round(0.85 * len(ordered))
        chosen = order[:cut] if split == "train" else order[cut:]
        return [np.array(ordered[i], dtype=np.int16) for i in chosen]

    def completions_of(self, partial: np.ndarray) -> np.ndarray:
        """Solutions ``[C, n]`` (columns) that keep the queens of ``partial`` (columns, -1 for none)."""
        sols = all_solutions(self.n)
        return sols[((sols == partial) | (partial < 0)).all(axis=1)]

    def nearest_completion(self, inputs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Each board's completion (among every solution of the board that keeps its queens) with the highest
        log-probability under ``logits``, as queen/empty tokens ``[B, n*n]``."""
        solutions = torch.from_numpy(_solution_tokens(self.n)).to(inputs.device)  # [S, n*n]
        is_queen = (solutions == QUEEN).to(logits.dtype)
        log_probs = torch.log_softmax(logits, -1)
        likelihood = log_probs[..., QUEEN] @ is_queen.T + log_probs[..., EMPTY] @ (1 - is_queen).T  # [B, S]
        dropped_a_given = (inputs == QUEEN).to(logits.dtype) @ (1 - is_queen).T > 0
        return solutions[likelihood.masked_fill(dropped_a_given, float("-inf")).argmax(-1)]

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(input board, completion board)`` for every unique input of ``split`` and each of its completions."""
        for _, board, completion in self._pairs(split, seed, None):
            yield board, completion

    def _pairs(self, split: str, seed: int, size: int | None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for index, partial in enumerate(self.split_inputs(split, seed)):
            if size is not None and index >= size:
                return
            rows = np.nonzero(partial >= 0)[0]
            board = np.zeros((self.n, self.n), dtype=bool)
            board[rows, partial[rows]] = True
            for columns in self.completions_of(partial):
                yield index, board, board_from_columns(columns)

    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows: one per (unique input, completion); puzzle and group are the unique input."""
        for index, board, completion in self._pairs(split, seed, size):
            yield self.encode(board), self.encode(completion), index, index, None

    def augment(self, inputs: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> None:
        """One of the 8 symmetries of the board per row, drawn at once for the batch, applied in place to the
        row's input and label alike (a symmetry maps completions of a board to completions of its image)."""
        n = self.n
        for i, k in enumerate(rng.integers(0, 8, len(inputs))):
            inputs[i] = dihedral(inputs[i].reshape(n, n), int(k)).reshape(-1)
            labels[i] = dihedral(labels[i].reshape(n, n), int(k)).reshape(-1)

    # -- tokens and checks ------------------------------------------------------------------------------
    def encode(self, puzzle: np.ndarray) -> np.ndarray:
        """Tokens ``[n*n]``: 1 empty, 2 queen."""
        board = np.asarray(puzzle, dtype=bool)
        if board.shape != (self.n, self.n):
            shape = "x".join(map(str, board.shape))
            raise UsageError(f"the board is {shape}, the task's {self.n}x{self.n} (option n sets the size)")
        return np.where(board.reshape(-1), QUEEN, EMPTY).astype(np.uint8)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """The board of ``tokens`` (anything but the queen token is empty)."""
        return (np.asarray(tokens).reshape(self.n, self.n) == QUEEN).copy()

    def verify(self, puzzle: np.ndarray, answer: np.ndarray) -> bool:
        """True when ``answer`` has n non-attacking queens and keeps the queens of ``puzzle``."""
        return self.violations(puzzle, answer) == 0

    def violations(self, puzzle: np.ndarray, answer: np.ndarray) -> int:
        """Attacking pairs, plus missing queens, plus given queens that ``answer`` dropped."""
        puzzle, answer = np.asarray(puzzle, dtype=bool), np.asarray(answer, dtype=bool)
        if answer.shape != puzzle.shape:
            raise UsageError(
                f"answer is {answer.shape[0]}x{answer.shape[1]}, puzzle {puzzle.shape[0]}x{puzzle.shape[1]}"
            )
        missing = max(0, len(answer) - int(answer.sum()))
        return attacking_pairs(answer) + missing + int((puzzle & ~answer).sum())

    def solutions(self, puzzle: np.ndarray, limit: int | None = None) -> list[np.ndarray]:
        """Every completion of ``puzzle`` (at most ``limit``)."""
        board = np.asarray(puzzle, dtype=bool)
        return [board_from_columns(c) for c in enumerate_solutions(len(board), board, limit)]

    def solve_exact(
        self, puzzle: np.ndarray, list_all: bool = False, limit: int | None = None
    ) -> ExactSolution:
        """Backtracking: the first completion and whether it is the only one, or every completion (at most
        ``limit``)."""
        found = self.solutions(puzzle, limit=limit if list_all else 2)
        boards = [self.format(b) for b in found]
        if list_all:
            payload = {"count": len(found), "solutions": boards}
            return ExactSolution(payload, "\n".join([*boards, f"count: {len(found)}"]), bool(found))
        payload = {"solution": boards[0] if boards else None, "count": len(found), "unique": len(found) == 1}
        if not found:
            return ExactSolution(payload, "no solution", False)
        count = "1 (unique)" if len(found) == 1 else "2+ (use --all to list every completion)"
        text = f"{self.format(found[0], pretty=True)}\nsolution: {boards[0]}\ncount: {count}"
        return ExactSolution(payload, text, True)

    def parse(self, text: str) -> np.ndarray:
        """A puzzle board (of side ``n`` when the option is given, else of its own square size); given queens
        that attack each other are an error."""
        board = parse_board(text, self.n if self.n_given else None)
        if attacking_pairs(board):
            where = [tuple(q) for q in np.argwhere(board).tolist()]
            raise UsageError(f"the given queens attack each other (queens at rows/columns {where})")
        return board

    def parse_answer(self, text: str, puzzle: np.ndarray | None = None) -> np.ndarray:
        """An answer board, of ``puzzle``'s size (attacks allowed: they make it invalid, not unreadable)."""
        size = len(puzzle) if puzzle is not None else (self.n if self.n_given else None)
        return parse_board(text, size)

    def format(self, answer: np.ndarray, pretty: bool = False) -> str:
        """The text form of a board: one line, or one line per row when ``pretty``."""
        return format_board(answer, pretty)

    def draw(self, ax: Any, puzzle: np.ndarray, answer: np.ndarray) -> None:
        """The board: given queens black, placed queens blue, queens under attack red, dropped givens as x."""
        puzzle, answer = np.asarray(puzzle, dtype=bool), np.asarray(answer, dtype=bool)
        n = len(answer)
        ax.imshow(np.add.outer(np.arange(n), np.arange(n)) % 2, cmap="Greys", vmin=-0.5, vmax=6)
        queens = np.argwhere(answer)
        rows, cols = queens[:, 0], queens[:, 1]
        attacks = (
            (rows[:, None] == rows)
            | (cols[:, None] == cols)
            | (rows[:, None] - cols[:, None] == rows - cols)
            | (rows[:, None] + cols[:, None] == rows + cols)
        )
        attacked = attacks.sum(axis=1) > 1  # a queen always "attacks" itself
        for (r, c), hit in zip(queens, attacked, strict=True):
            color = "tab:red" if hit else ("black" if puzzle[r, c] else "tab:blue")
            ax.scatter([c], [r], s=(120 / n) ** 2, color=color, zorder=2)
        for r, c in np.argwhere(puzzle & ~answer):
            ax.scatter([c], [r], s=(120 / n) ** 2, marker="x", color="tab:red", zorder=2)
        ax.set_xticks([])
        ax.set_yticks([])

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task."""
        return {"n": self.n, "k": self.k, "tokens": {"pad": PAD, "empty": EMPTY, "queen": QUEEN}}
