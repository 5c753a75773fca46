"""Maze-Hard (HRM, TRM): mark a shortest path from the start to the goal of a grid maze.

A maze is a square grid of cells, each one character of :data:`CHARSET`: ``'#'`` wall, ``' '`` open,
``'S'`` start, ``'G'`` goal, ``'o'`` a cell of the path (answers only). Moves go up, down, left or right
between cells that are not walls. A puzzle has exactly one S and one G and no ``'o'``; its answer is the same
grid with the cells strictly between S and G of one shortest S-G path marked ``'o'``. Any shortest path is a
right answer, and the generated mazes often have several.

Token ids are the character's index in :data:`CHARSET` plus one, 0 being padding, as in the official
``dataset/build_maze_dataset.py`` of HRM and TRM: an official maze row maps onto this task token for token
(:data:`TOKEN_OF_CHAR`, :data:`CHAR_OF_TOKEN`).

Text form: one row per line (or rows separated by ``'/'``), or the official flat form, ``size * size``
characters on one line; ``'.'`` is read as an open cell, so a maze can be typed without trailing spaces. A
text that names an existing file is read from that file.

Generated mazes: a perfect maze carved by a randomised depth-first search over the cells at odd coordinates
(corridors one cell wide), then every interior wall cell opened with probability ``openness``, which adds
loops, open patches and with them several shortest paths; S is a random open cell and G a random open cell at
least ``min_length`` moves away by the shortest path (the hardness knob). The HRM paper keeps the Maze-Hard
mazes whose difficulty exceeds 110; taking difficulty to be the shortest path's number of moves,
``min_length`` defaults to 111 on the 30x30 grid and to the same share of the grid's area on other sizes
(111 * size^2 / 900, at least 2). A maze is a test maze when a hash of its puzzle grid falls in 3 of 20
buckets, else a training maze, so the two endless splits never share a maze.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from latentloop.data.augment import dihedral
from latentloop.data.official import OfficialDataset, open_official
from latentloop.errors import UsageError
from latentloop.tasks.base import ExactSolution, Task

#: The cell characters, in token order: token ``i + 1`` is ``CHARSET[i]`` (the official builder's charset).
CHARSET = "# SGo"
PAD, WALL, OPEN, START, GOAL, PATH = 0, 1, 2, 3, 4, 5
#: Character -> token id, and back (0 is padding and has no character).
TOKEN_OF_CHAR: dict[str, int] = {ch: i + 1 for i, ch in enumerate(CHARSET)}
CHAR_OF_TOKEN: dict[int, str] = {i + 1: ch for i, ch in enumerate(CHARSET)}
VOCAB_SIZE = len(CHARSET) + 1
#: Maze-Hard's grid side and the shortest-path length its mazes reach (difficulty above 110, HRM paper).
MAZE_HARD_SIZE = 30
MAZE_HARD_MIN_LENGTH = 111
DEFAULT_OPENNESS = 0.05
SOLUTION_LIMIT = 1000  # default cap of solutions(): the number of shortest paths can grow exponentially
_OPEN_ALIAS = "."
_MOVES = ((-1, 0), (0, -1), (1, 0), (0, 1))  # up, left, down, right: the canonical path's tie order
_TRIES = 1000  # mazes drawn in a row without a long enough path before the generator gives up


# ----------------------------------------------------------------------------------------------------------
# Text form
# ----------------------------------------------------------------------------------------------------------


def parse_maze(text: str, size: int | None = None, answer: bool = False) -> np.ndarray:
    """A maze grid of token ids ``[n, n]`` from its text form (module docstring); ``size``, when given, is the
    side it must have. A puzzle (``answer=False``) needs exactly one S and one G and no path cell; an answer
    may hold anything of the charset (the verifier judges it)."""
    role = "answer" if answer else "maze"
    if "\n" not in text:
        try:
            is_file = Path(text).is_file()
        except (OSError, ValueError):  # too long or odd to be a file name: it is the maze itself
            is_file = False
        if is_file:
            try:
                text = Path(text).read_text()
            except (OSError, UnicodeDecodeError) as error:
                reason = getattr(error, "strerror", None) or "not a text file"
                raise UsageError(f"cannot read maze file {text!r}: {reason}") from None
    rows = text.replace("\r\n", "\n").replace("\r", "\n").replace("/", "\n").split("\n")
    while rows and not rows[0]:
        rows.pop(0)
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        raise UsageError(f"the {role} is empty (one row of '#', ' ', 'S', 'G' per line)")
    allowed = CHARSET if answer else CHARSET.replace("o", "")
    tokens: list[list[int]] = []
    for r, row in enumerate(rows):
        tokens.append([])
        for c, ch in enumerate(row):
            ch = " " if ch == _OPEN_ALIAS else ch
            if ch not in allowed:
                what = "a path cell 'o' (paths belong in answers)" if ch == "o" else f"character {ch!r}"
                where = f"row {r + 1}, column {c + 1}" if len(rows) > 1 else f"position {c + 1}"
                raise UsageError(
                    f"unexpected {what} at {where} of the {role} "
                    f"('#' wall, ' ' or '.' open, 'S' start, 'G' goal{', o path' if answer else ''})"
                )
            tokens[-1].append(TOKEN_OF_CHAR[ch])
    if len(tokens) == 1:  # the official flat form: size * size characters
        flat = tokens[0]
        side = math.isqrt(len(flat))
        if side < 2 or side * side != len(flat):
            raise UsageError(
                f"a one-line {role} needs a square number of cells (size x size), got {len(flat)}; "
                "or give one row per line"
            )
        tokens = [flat[i * side : (i + 1) * side] for i in range(side)]
    for number, row in enumerate(tokens, start=1):
        if len(row) != len(tokens[0]):
            raise UsageError(
                f"row {number} of the {role} has {len(row)} cells, row 1 has {len(tokens[0])} "
                "(open cells are spaces or '.')"
            )
    if len(tokens) != len(tokens[0]) or len(tokens) < 2:
        raise UsageError(f"a {role} is a square grid of at least 2x2, got {len(tokens)}x{len(tokens[0])}")
    if size is not None and len(tokens) != size:
        raise UsageError(f"the {role} is {len(tokens)}x{len(tokens)}, the task's {size}x{size} (option size)")
    grid = np.array(tokens, dtype=np.uint8)
    if not answer:
        check_puzzle(grid)
    return grid


def format_maze(grid: np.ndarray) -> str:
    """One row per line, in the charset's characters ('?' for a token that is no cell)."""
    return "\n".join("".join(CHAR_OF_TOKEN.get(int(t), "?") for t in row) for row in np.asarray(grid))


def check_puzzle(grid: np.ndarray) -> np.ndarray:
    """``grid`` as a square uint8 array, after checking that it is a puzzle: walls and open cells, one S and
    one G (a :class:`UsageError` otherwise)."""
    grid = np.asarray(grid)
    if grid.ndim != 2 or grid.shape[0] != grid.shape[1]:
        raise UsageError(f"a maze is a square grid, got shape {grid.shape}")
    bad = ~np.isin(grid, (WALL, OPEN, START, GOAL))
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise UsageError(f"a maze puzzle holds only walls, open cells, S and G; cell ({r}, {c}) is not one")
    for token, name in ((START, "S (start)"), (GOAL, "G (goal)")):
        count = int((grid == token).sum())
        if count != 1:
            raise UsageError(f"a maze needs exactly one {name}, found {count}")
    return grid.astype(np.uint8, copy=False)


# ----------------------------------------------------------------------------------------------------------
# Shortest paths
# ----------------------------------------------------------------------------------------------------------


def _where(grid: np.ndarray, token: int) -> tuple[int, int]:
    r, c = np.argwhere(grid == token)[0]
    return int(r), int(c)


def distances(grid: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """Moves from ``source`` to every cell by breadth-first search through non-wall cells (-1: unreachable)."""
    n = grid.shape[0]
    passable = np.asarray(grid) != WALL
    dist = np.full(grid.shape, -1, dtype=np.int32)
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        step = dist[r, c] + 1
        for dr, dc in _MOVES:
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and passable[rr, cc] and dist[rr, cc] < 0:
                dist[rr, cc] = step
                queue.append((rr, cc))
    return dist


def shortest_path_length(grid: np.ndarray) -> int | None:
    """Moves of a shortest S-G path of the puzzle ``grid``, or None when G cannot be reached."""
    grid = check_puzzle(grid)
    d = int(distances(grid, _where(grid, START))[_where(grid, GOAL)])
    return d if d >= 0 else None


def _layers(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``(distances from S, distances from G, S-G distance)`` of a puzzle (-1 when G is unreachable)."""
    grid = check_puzzle(grid)
    from_start, from_goal = distances(grid, _where(grid, START)), distances(grid, _where(grid, GOAL))
    return from_start, from_goal, int(from_start[_where(grid, GOAL)])


def count_shortest_paths(grid: np.ndarray) -> int:
    """The number of distinct shortest S-G paths (0 when G is unreachable), counted over the breadth-first
    layers: the paths into a cell are the sum of those into its neighbours one layer nearer S."""
    from_start, _, d = _layers(grid)
    if d < 0:
        return 0
    n = grid.shape[0]
    ways = np.zeros(grid.shape, dtype=object)  # Python integers: the count can exceed 64 bits
    ways[_where(grid, START)] = 1
    cells = zip(*np.nonzero((from_start > 0) & (from_start <= d)), strict=True)
    for r, c in sorted(cells, key=lambda rc: from_start[rc]):
        layer = from_start[r, c] - 1
        ways[r, c] = sum(
            ways[r + dr, c + dc]
            for dr, dc in _MOVES
            if 0 <= r + dr < n and 0 <= c + dc < n and from_start[r + dr, c + dc] == layer
        )
    return int(ways[_where(grid, GOAL)])


def shortest_paths(grid: np.ndarray, limit: int | None = None) -> list[list[tuple[int, int]]]:
    """Distinct shortest S-G paths as cell lists from S to G (at most ``limit``), in a fixed order: a
    depth-first walk over the cells that lie on some shortest path (distance from S plus distance to G equals
    the S-G distance)."""
    from_start, from_goal, d = _layers(grid)
    if d < 0 or (limit is not None and limit < 1):
        return []
    n = grid.shape[0]
    on_path = (from_start >= 0) & (from_goal >= 0) & (from_start + from_goal == d)
    found: list[list[tuple[int, int]]] = []
    path = [_where(grid, START)]
    stack = [iter(_MOVES)]  # per depth, the moves left to try from that depth's cell
    while stack:
        if len(path) == d + 1:
            found.append(list(path))
            if limit is not None and len(found) >= limit:
                break
            path.pop()
            stack.pop()
            continue
        r, c = path[-1]
        for dr, dc in stack[-1]:
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and on_path[rr, cc] and from_start[rr, cc] == len(path):
                path.append((rr, cc))
                stack.append(iter(_MOVES))
                break
        else:
            path.pop()
            stack.pop()
    return found


def mark_path(grid: np.ndarray, path: list[tuple[int, int]]) -> np.ndarray:
    """A copy of the puzzle ``grid`` with the cells of ``path`` between its ends marked as path cells."""
    answer = np.array(grid, dtype=np.uint8)
    for cell in path[1:-1]:
        answer[cell] = PATH
    return answer


def solve_maze(grid: np.ndarray) -> np.ndarray | None:
    """The canonical answer: the puzzle with the shortest path that walks back from G through the first
    neighbour one layer nearer S (up, left, down, right) marked; None when G cannot be reached."""
    grid = check_puzzle(grid)
    from_start, _, d = _layers(grid)
    if d < 0:
        return None
    n = grid.shape[0]
    cell = _where(grid, GOAL)
    path = [cell]
    while from_start[cell] > 0:
        r, c = cell
        cell = next(
            (r + dr, c + dc)
            for dr, dc in _MOVES
            if 0 <= r + dr < n and 0 <= c + dc < n and from_start[r + dr, c + dc] == from_start[cell] - 1
        )
        path.append(cell)
    return mark_path(grid, path[::-1])


def _components(mask: np.ndarray) -> int:
    """The number of 4-connected components of the True cells of ``mask``."""
    n = mask.shape[0]
    seen = np.zeros_like(mask, dtype=bool)
    count = 0
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        count += 1
        seen[start] = True
        queue = deque([start])
        while queue:
            r, c = queue.popleft()
            for dr, dc in _MOVES:
                rr, cc = r + dr, c + dc
                if 0 <= rr < n and 0 <= cc < n and mask[rr, cc] and not seen[rr, cc]:
                    seen[rr, cc] = True
                    queue.append((rr, cc))
    return count


def path_violations(puzzle: np.ndarray, answer: np.ndarray) -> int:
    """How far ``answer`` is from the puzzle with one shortest S-G path marked: cells changed other than open
    cells marked 'o' (walls, S and G moved or removed, stray characters), plus the extra pieces of the marked
    cells (S, G and the 'o' cells on open cells: one connected piece in a valid answer), plus the difference
    between the number of 'o' cells and the shortest path's inner cells. It is 0 exactly when the marked cells
    form a connected set of ``d + 1`` cells holding S and G, ``d`` being the S-G distance: a shortest path."""
    puzzle = check_puzzle(puzzle)
    answer = np.asarray(answer)
    if answer.shape != puzzle.shape:
        raise UsageError(
            f"the answer is {'x'.join(map(str, answer.shape))}, the maze {puzzle.shape[0]}x{puzzle.shape[0]}"
        )
    marked_open = (puzzle == OPEN) & (answer == PATH)
    changed = int(((answer != puzzle) & ~marked_open).sum())
    marked = marked_open | (puzzle == START) | (puzzle == GOAL)
    pieces = _components(marked) - 1
    d = int(distances(puzzle, _where(puzzle, START))[_where(puzzle, GOAL)])
    if d < 0:  # S and G lie in separate pieces whatever is marked: never 0
        return changed + pieces
    return changed + pieces + abs(int(marked_open.sum()) - (d - 1))


# ----------------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------------


def default_min_length(size: int) -> int:
    """Maze-Hard's shortest-path length scaled to the area of a ``size x size`` grid (at least 2)."""
    return max(2, round(MAZE_HARD_MIN_LENGTH * size * size / (MAZE_HARD_SIZE * MAZE_HARD_SIZE)))


def carve(rng: np.random.Generator, size: int, openness: float) -> np.ndarray:
    """A maze without S and G: a perfect maze (randomised depth-first search over the cells at odd
    coordinates), then each interior wall cell opened with probability ``openness``."""
    grid = np.full((size, size), WALL, dtype=np.uint8)
    side = (size - 1) // 2  # cells per row at coordinates 1, 3, ..., 2 * side - 1
    visited = np.zeros((side, side), dtype=bool)
    first = (int(rng.integers(side)), int(rng.integers(side)))
    visited[first] = True
    grid[2 * first[0] + 1, 2 * first[1] + 1] = OPEN
    stack = [first]
    while stack:
        r, c = stack[-1]
        fresh = [
            (r + dr, c + dc)
            for dr, dc in _MOVES
            if 0 <= r + dr < side and 0 <= c + dc < side and not visited[r + dr, c + dc]
        ]
        if not fresh:
            stack.pop()
            continue
        nr, nc = fresh[int(rng.integers(len(fresh)))]
        visited[nr, nc] = True
        grid[r + nr + 1, c + nc + 1] = OPEN  # the wall cell between the two cells
        grid[2 * nr + 1, 2 * nc + 1] = OPEN
        stack.append((nr, nc))
    knock = rng.random((size - 2, size - 2)) < openness
    interior = grid[1:-1, 1:-1]
    interior[knock & (interior == WALL)] = OPEN
    return grid


def generate_maze(
    rng: np.random.Generator, size: int, min_length: int, openness: float = DEFAULT_OPENNESS
) -> tuple[np.ndarray, np.ndarray]:
    """``(puzzle, canonical answer)``: a carved maze (:func:`carve`) with S at a random open cell and G at a
    random open cell at least ``min_length`` moves from S along a shortest path; a new maze is drawn while
    no cell is that far. A :class:`UsageError` when :data:`_TRIES` mazes in a row had none."""
    for _ in range(_TRIES):
        grid = carve(rng, size, openness)
        cells = np.argwhere(grid == OPEN)
        start = tuple(int(v) for v in cells[rng.integers(len(cells))])
        far = np.argwhere(distances(grid, start) >= min_length)
        if not len(far):
            continue
        goal = tuple(int(v) for v in far[rng.integers(len(far))])
        grid[start], grid[goal] = START, GOAL
        answer = solve_maze(grid)
        assert answer is not None
        return grid, answer
    raise UsageError(
        f"no {size}x{size} maze with a shortest path of at least {min_length} moves in {_TRIES} tries "
        "(lower option min_length, or option openness)"
    )


def in_test_split(puzzle: np.ndarray, seed: int) -> bool:
    """Whether the maze belongs to the test split of ``seed``: a hash of its grid falls in 3 of 20 buckets."""
    return zlib.crc32(np.ascontiguousarray(puzzle, dtype=np.uint8).tobytes(), seed & 0xFFFFFFFF) % 20 < 3


# ----------------------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------------------


def _int_option(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"option {name} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise UsageError(f"option {name} must be in {low}..{high}, got {number}")
    return number


class MazeTask(Task):
    """Shortest paths in ``size x size`` mazes (Maze-Hard: 30x30, the default).

    Options: ``size`` (grid side, 5..99, default 30; ``n`` is the same option, as for the other grids; a maze
    read without either takes its own size), ``min_length`` (the fewest moves of a generated maze's shortest
    path, default :func:`default_min_length`: 111 at 30x30), ``openness`` (chance that an interior wall cell
    is opened after carving, default 0.05; more gives more loops and shorter paths), ``data`` (a folder
    written by the official ``build_maze_dataset.py``, read as it is instead of generating mazes: see
    :mod:`latentloop.data.official`; its side is ``size``, 30 by default).
    Tokens: 0 = pad, then ``'#', ' ', 'S', 'G', 'o'`` = 1..5 (:data:`TOKEN_OF_CHAR`); rows are ``size^2`` long.
    """

    name = "maze"
    multi_solution = True
    endless = True
    drawable = True

    def __init__(
        self,
        size: int | str | None = None,
        n: int | str | None = None,
        min_length: int | str | None = None,
        openness: float | str = DEFAULT_OPENNESS,
        data: str | None = None,
    ) -> None:
        sides = {_int_option(name, v, 5, 99) for name, v in (("size", size), ("n", n)) if v is not None}
        if len(sides) > 1:
            raise UsageError(f"options size and n both set the grid side and disagree: {size} and {n}")
        self.size_given = bool(sides)
        self.size = sides.pop() if sides else MAZE_HARD_SIZE
        cells = ((self.size - 1) // 2) ** 2
        self.min_length = (
            default_min_length(self.size)
            if min_length is None
            else _int_option("min_length", min_length, 1, 4 * cells)
        )
        try:
            self.openness = float(openness)
        except (TypeError, ValueError):
            raise UsageError(f"option openness must be a number, got {openness!r}") from None
        if not 0.0 <= self.openness < 1.0:
            raise UsageError(f"option openness must be in [0, 1), got {self.openness}")
        self.seq_len = self.size * self.size
        self.vocab_size = VOCAB_SIZE
        self.data = Path(data) if data else None
        self._official: OfficialDataset | None = None
        if self.data is not None and not self.data.is_dir():
            raise UsageError(f"option data: no such folder {str(self.data)!r}")
        self.endless = self.data is None

    def official_dataset(self) -> OfficialDataset | None:
        """The official maze folder given as ``data``, checked and opened (once): its tokens are this task's."""
        if self.data is not None and self._official is None:
            self._official = open_official(
                self.data, task=self.name, seq_len=self.seq_len, vocab_size=self.vocab_size
            )
        return self._official

    # -- examples --------------------------------------------------------------------------------------
    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Endless ``(puzzle, canonical answer)`` pairs of ``split``, deterministic in ``seed``: the splits draw
        from separate random streams and each keeps only the mazes that :func:`in_test_split` gives it."""
        if split not in ("train", "test"):
            raise UsageError(f"split must be 'train' or 'test', got {split!r}")
        official = self.official_dataset()
        if official is not None:
            # The original of each group (its first maze), with the label the official folder holds.
            last = -1
            for row in official.splits[split].rows():
                if row.group != last:
                    last = row.group
                    yield self.decode(row.inputs), self.decode(row.labels)
            return
        test = split == "test"
        rng = np.random.default_rng([seed, int(test), 0x3A2E])
        while True:
            puzzle, answer = generate_maze(rng, self.size, self.min_length, self.openness)
            if in_test_split(puzzle, seed) == test:
                yield puzzle, answer

    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows, one per distinct maze (its canonical answer as the label), with the shortest path's
        length and number of shortest paths as the puzzle's info. An official folder (``data``) gives every row
        of its first ``size`` groups, its augmented copies included, with no info."""
        official = self.official_dataset()
        if official is not None:
            if split not in official.splits:
                raise UsageError(f"split must be 'train' or 'test', got {split!r}")
            for row in official.splits[split].rows(stop=size):
                yield row.inputs.copy(), row.labels.copy(), row.puzzle, row.group, None
            return
        seen: set[bytes] = set()
        for puzzle, answer in self.examples(split, seed):
            if size is not None and len(seen) >= size:
                return
            key = puzzle.tobytes()
            if key in seen:
                continue
            seen.add(key)
            index = len(seen) - 1
            length = int((answer == PATH).sum()) + 1
            info = {"length": length, "shortest_paths": count_shortest_paths(puzzle)}
            yield self.encode(puzzle), self.encode(answer), index, index, info

    def augment(self, inputs: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> None:
        """One of the 8 symmetries of the square per row, applied in place to its maze and answer alike (a
        symmetry keeps moves as moves, so a shortest path stays a shortest path)."""
        n = self.size
        for i, k in enumerate(rng.integers(0, 8, len(inputs))):
            inputs[i] = dihedral(inputs[i].reshape(n, n), int(k)).reshape(-1)
            labels[i] = dihedral(labels[i].reshape(n, n), int(k)).reshape(-1)

    # -- tokens and checks ------------------------------------------------------------------------------
    def encode(self, puzzle: np.ndarray) -> np.ndarray:
        """Tokens ``[size * size]``: the grid's token ids row by row."""
        grid = np.asarray(puzzle)
        if grid.shape != (self.size, self.size):
            shape = "x".join(map(str, grid.shape))
            raise UsageError(f"the maze is {shape}, the task's {self.size}x{self.size} (option size)")
        if grid.min() < WALL or grid.max() > PATH:
            raise UsageError("a maze grid holds token ids 1..5 ('#', ' ', 'S', 'G', 'o')")
        return grid.reshape(-1).astype(np.uint8)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """The grid of ``tokens`` (pad and unknown ids are kept: the verifier counts them as changed cells)."""
        return np.asarray(tokens).reshape(self.size, self.size).astype(np.uint8)

    def verify(self, puzzle: np.ndarray, answer: np.ndarray) -> bool:
        """True when ``answer`` is ``puzzle`` with one shortest S-G path marked (see :func:`path_violations`)."""
        return self.violations(puzzle, answer) == 0

    def violations(self, puzzle: np.ndarray, answer: np.ndarray) -> int:
        """Changed cells, extra pieces of the marked path and its length's distance from the shortest
        (:func:`path_violations`)."""
        return path_violations(puzzle, answer)

    def solutions(self, puzzle: np.ndarray, limit: int | None = None) -> list[np.ndarray]:
        """Every shortest path marked on the puzzle (at most ``limit``; default :data:`SOLUTION_LIMIT`)."""
        cap = SOLUTION_LIMIT if limit is None else limit
        return [mark_path(puzzle, p) for p in shortest_paths(puzzle, cap)]

    def solve_exact(
        self, puzzle: np.ndarray, list_all: bool = False, limit: int | None = None
    ) -> ExactSolution:
        """Breadth-first search: one shortest path, its length and how many shortest paths there are, or every
        shortest path (at most ``limit``, default :data:`SOLUTION_LIMIT`)."""
        count = count_shortest_paths(puzzle)
        if count == 0:
            payload = {"solution": None, "length": None, "count": 0, "unique": False}
            return ExactSolution(payload, "no path from S to G", False)
        length = int(shortest_path_length(puzzle) or 0)
        if list_all:
            found = [self.format(s) for s in self.solutions(puzzle, limit)]
            payload = {"length": length, "count": count, "listed": len(found), "solutions": found}
            more = f" ({len(found)} listed)" if len(found) < count else ""
            return ExactSolution(payload, "\n\n".join([*found, f"count: {count}{more}"]), True)
        answer = solve_maze(puzzle)
        text = self.format(answer)
        payload = {"solution": text, "length": length, "count": count, "unique": count == 1}
        paths = "1 (unique)" if count == 1 else f"{count} (use --all to list them)"
        return ExactSolution(payload, f"{text}\nlength: {length} moves\nshortest paths: {paths}", True)

    def parse(self, text: str) -> np.ndarray:
        """A maze puzzle (of side ``size`` when the option is given, else of its own size)."""
        return parse_maze(text, self.size if self.size_given else None)

    def parse_answer(self, text: str, puzzle: np.ndarray | None = None) -> np.ndarray:
        """An answer grid of the puzzle's size (anything of the charset: the verifier judges it)."""
        size = len(puzzle) if puzzle is not None else (self.size if self.size_given else None)
        return parse_maze(text, size, answer=True)

    def format(self, answer: np.ndarray, pretty: bool = False) -> str:
        """One row per line in the charset's characters (the same form whether or not ``pretty``)."""
        return format_maze(answer)

    def draw(self, ax: Any, puzzle: np.ndarray, answer: np.ndarray) -> None:
        """The maze: walls black, S green, G red, path cells blue; cells changed otherwise crossed in red."""
        puzzle, answer = np.asarray(puzzle), np.asarray(answer)
        colours = {WALL: (0.1, 0.1, 0.1), OPEN: (1.0, 1.0, 1.0), START: (0.17, 0.63, 0.17)}
        colours |= {GOAL: (0.84, 0.15, 0.16), PATH: (0.12, 0.47, 0.71)}
        image = np.ones((*answer.shape, 3))
        for token, colour in colours.items():
            image[answer == token] = colour
        ax.imshow(image, interpolation="nearest")
        wrong = (answer != puzzle) & ~((puzzle == OPEN) & (answer == PATH))
        rows, cols = np.nonzero(wrong)
        ax.scatter(cols, rows, marker="x", color="tab:red", s=(120 / len(answer)) ** 2, zorder=2)
        ax.set_xticks([])
        ax.set_yticks([])

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task."""
        return {
            "size": self.size,
            "min_length": self.min_length,
            "openness": self.openness,
            "charset": CHARSET,
            "tokens": {"pad": PAD, "wall": WALL, "open": OPEN, "start": START, "goal": GOAL, "path": PATH},
        }
