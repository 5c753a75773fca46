"""Graph colouring as in GRAM: colour the vertices of a small random graph with K colours, no edge monochrome.

A graph is a :class:`Graph` (``n`` vertices ``0..n-1``, undirected edges). Accepted text forms, wherever a
graph is expected:

* a path ending in ``.col``: a DIMACS graph file (``p edge V E`` then ``e u v`` lines, vertices 1-based);
* the upper triangle of the adjacency matrix, row by row, as ``n(n-1)/2`` characters '0'/'1';
* an edge list of 0-based vertex pairs ``u-v`` separated by commas or spaces, e.g. ``0-1,1-2,2-0``
  (the graph has ``max id + 1`` vertices unless option ``n`` was given).

An answer (colouring) is one colour ``0..K-1`` per vertex: ``"01201201"``, or separated by commas/spaces
(needed for colours from 10 on: ``"0,1,10,2"``). A colouring is *canonical* when colours first appear in the
order 0, 1, 2... over vertices 0, 1, 2...

The exact solver and the verifier take any number of colours K. A learned model has one token per colour in
its vocabulary, and its datasets and models take at most :data:`MODEL_COLORS` colours.

Tokens (length ``n(n-1)/2 + n``): the upper-triangle adjacency then one slot per vertex. 0 = pad (in
labels: not scored), 1 = no edge, 2 = edge, 3 = unknown colour, ``4 + c`` = colour ``c``. Inputs hold the
adjacency and unknown colours; labels hold 0 over the adjacency and the colours.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import zlib
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentloop.errors import UsageError
from latentloop.tasks.base import ExactSolution, Task

PAD, NO_EDGE, EDGE, UNKNOWN, COLOR0 = 0, 1, 2, 3, 4
# The most colours a learned model's vocabulary holds (token 4 + c for colour c); the exact solver has no cap.
MODEL_COLORS = 10
# The most colours whose every naming (K! of them) nearest_completion tries
NAMED_COLORS = 5


@dataclass(frozen=True)
class Graph:
    """An undirected graph on vertices ``0..n-1``; ``edges`` are sorted pairs ``(u, v)`` with ``u < v``."""

    n: int
    edges: tuple[tuple[int, int], ...]

    @classmethod
    def from_edges(cls, n: int, edges: Any) -> Graph:
        """A graph from any iterable of vertex pairs (duplicates and orientation ignored; no self-loops)."""
        clean = set()
        for u, v in edges:
            u, v = int(u), int(v)
            if u == v:
                raise UsageError(f"self-loop on vertex {u}: such a graph has no colouring")
            if not (0 <= u < n and 0 <= v < n):
                raise UsageError(f"edge {u}-{v} names a vertex outside 0..{n - 1}")
            clean.add((min(u, v), max(u, v)))
        return cls(n, tuple(sorted(clean)))

    @classmethod
    def from_upper_triangle(cls, bits: np.ndarray, n: int) -> Graph:
        """A graph from its ``n(n-1)/2`` upper-triangle adjacency bits (row by row)."""
        rows, cols = np.triu_indices(n, k=1)
        on = np.asarray(bits).astype(bool)
        return cls(n, tuple(zip(rows[on].tolist(), cols[on].tolist(), strict=True)))

    def upper_triangle(self) -> np.ndarray:
        """The ``n(n-1)/2`` adjacency bits above the diagonal, row by row."""
        adjacency = np.zeros((self.n, self.n), dtype=bool)
        if self.edges:
            u, v = np.array(self.edges).T
            adjacency[u, v] = True
        return adjacency[np.triu_indices(self.n, k=1)]

    def neighbours(self) -> list[set[int]]:
        """The neighbour set of every vertex."""
        result: list[set[int]] = [set() for _ in range(self.n)]
        for u, v in self.edges:
            result[u].add(v)
            result[v].add(u)
        return result


# ----------------------------------------------------------------------------------------------------------
# Reading graphs and colourings
# ----------------------------------------------------------------------------------------------------------


def read_dimacs(path: str | Path) -> Graph:
    """Read a DIMACS ``.col`` graph; an unreadable or malformed file is a :class:`UsageError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not a text file"
        raise UsageError(f"cannot read graph file {str(path)!r}: {reason}") from None
    n: int | None = None
    edges = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] in ("c", "n", "x"):  # comments, vertex weights
            continue
        try:
            if fields[0] == "p" and len(fields) >= 4 and n is None:
                n = int(fields[2])
                if n < 1:
                    raise ValueError
            elif fields[0] == "e" and len(fields) >= 3 and n is not None:
                edges.append((int(fields[1]) - 1, int(fields[2]) - 1))
            else:
                raise ValueError
        except ValueError:
            raise UsageError(f"{path}:{number}: malformed DIMACS line {line.strip()!r}") from None
    if n is None:
        raise UsageError(f"{path}: no 'p edge VERTICES EDGES' line (not a DIMACS .col file)")
    try:
        return Graph.from_edges(n, edges)
    except UsageError as error:
        raise UsageError(f"{path}: {error} (vertices are 1..{n} in the file)") from None


def parse_graph(text: str, n: int | None = None) -> Graph:
    """A graph from any accepted text form (module docstring); ``n``, when given, must match."""
    text = text.strip()
    if text.lower().endswith(".col"):
        graph = read_dimacs(text)
    elif text and re.fullmatch(r"[01\s]+", text):
        bits = np.array([int(ch) for ch in re.sub(r"\s", "", text)], dtype=np.int8)
        size = round((1 + (1 + 8 * len(bits)) ** 0.5) / 2)
        if size * (size - 1) // 2 != len(bits):
            raise UsageError(f"an upper-triangle adjacency has n(n-1)/2 bits; {len(bits)} is no such number")
        graph = Graph.from_upper_triangle(bits, size)
    else:
        pairs = [p for p in re.split(r"[,;\s]+", text) if p]
        edges = []
        for pair in pairs:
            match = re.fullmatch(r"(\d+)-(\d+)", pair)
            if not match:
                raise UsageError(
                    f"cannot read {pair!r} as an edge: give a .col file, 0/1 upper-triangle bits or edges like 0-1,1-2"
                )
            edges.append((int(match[1]), int(match[2])))
        if not edges:
            raise UsageError(
                "the graph is empty: give a .col file, 0/1 upper-triangle bits or edges like 0-1,1-2"
            )
        size = max(max(e) for e in edges) + 1
        graph = Graph.from_edges(max(size, n or 0), edges)
    if n is not None and graph.n != n:
        raise UsageError(f"the graph has {graph.n} vertices, option n says {n}")
    return graph


def parse_coloring(text: str, n: int, colors: int) -> tuple[int, ...]:
    """A colouring of ``n`` vertices: one digit per vertex, or numbers separated by commas/spaces."""
    parts = [p for p in re.split(r"[,;\s]+", text.strip()) if p]
    if len(parts) == 1 and len(parts[0]) > 1:
        parts = list(parts[0])
    if not all(p.isdigit() for p in parts):
        raise UsageError(
            f"a colouring is one colour number per vertex (0..{colors - 1}; separated by commas from 10 on), "
            f"got {text!r}"
        )
    if len(parts) != n:
        raise UsageError(f"the colouring has {len(parts)} entries, the graph {n} vertices")
    return tuple(int(p) for p in parts)


def canonical(coloring: tuple[int, ...] | np.ndarray) -> tuple[int, ...]:
    """Relabel colours in order of first appearance over vertices 0, 1, 2..."""
    relabel: dict[int, int] = {}
    return tuple(relabel.setdefault(int(c), len(relabel)) for c in coloring)


def conflicts(graph: Graph, coloring: tuple[int, ...] | np.ndarray) -> int:
    """Edges whose two ends share a colour."""
    return sum(1 for u, v in graph.edges if coloring[u] == coloring[v])


# ----------------------------------------------------------------------------------------------------------
# Exact colouring
# ----------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def canonical_colorings(n: int, colors: int) -> np.ndarray:
    """Every canonical colouring of ``n`` vertices with at most ``colors`` colours, as ``[M, n]`` (cached)."""
    colors = min(colors, n)  # a canonical colouring of n vertices uses at most n colours
    table = np.zeros((1, 0), dtype=np.int8)
    highest = np.full(1, -1)
    for _ in range(n):
        blocks, tops = [], []
        for c in range(colors):
            keep = highest >= c - 1  # colour c may only follow once colour c-1 has appeared
            blocks.append(np.hstack([table[keep], np.full((int(keep.sum()), 1), c, np.int8)]))
            tops.append(np.maximum(highest[keep], c))
        table, highest = np.vstack(blocks), np.concatenate(tops)
    order = np.lexsort(table.T[::-1])
    return table[order]


def all_colorings_small(graph: Graph, colors: int) -> np.ndarray:
    """All canonical proper colourings ``[C, n]`` by testing every canonical colouring at once (small n)."""
    table = canonical_colorings(graph.n, colors)
    if not graph.edges:
        return table
    u, v = np.array(graph.edges).T
    return table[(table[:, u] != table[:, v]).all(axis=1)]


def color_graph(graph: Graph, colors: int, limit: int | None = 1, max_nodes: int = 2_000_000):
    """Exact colouring search: ``(canonical colourings found (at most limit), finished)``.

    DSATUR backtracking (the uncoloured vertex with the fewest colours left goes next) with colour symmetry
    broken by opening at most one new colour per step, so each partition into colour classes is met once.
    ``finished`` is False when the search stopped after ``max_nodes`` nodes without settling the question.
    """
    colors = min(colors, graph.n)  # a canonical colouring uses at most one colour per vertex
    neighbours = graph.neighbours()
    color = [-1] * graph.n
    banned = [0] * graph.n  # bit c set: a neighbour already has colour c
    found: list[tuple[int, ...]] = []
    nodes = 0
    cap = float("inf") if limit is None else limit
    full = (1 << colors) - 1

    class _GiveUp(Exception):
        pass

    def search(coloured: int, opened: int) -> bool:
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            raise _GiveUp
        if coloured == graph.n:
            found.append(canonical(color))
            return len(found) >= cap
        best, best_key = -1, None
        for v in range(graph.n):
            if color[v] < 0:
                key = (bin(full & ~banned[v]).count("1"), -len(neighbours[v]))
                if best_key is None or key < best_key:
                    best, best_key = v, key
        allowed = full & ~banned[best] & ((1 << min(opened + 1, colors)) - 1)
        for c in range(min(opened + 1, colors)):
            if not (allowed >> c) & 1:
                continue
            color[best] = c
            changed = [w for w in neighbours[best] if color[w] < 0 and not (banned[w] >> c) & 1]
            for w in changed:
                banned[w] |= 1 << c
            done = search(coloured + 1, max(opened, c + 1))
            for w in changed:
                banned[w] &= ~(1 << c)
            color[best] = -1
            if done:
                return True
        return False

    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, graph.n + 200))
    try:
        search(0, 0)
        finished = True
    except _GiveUp:
        finished = False
    finally:
        sys.setrecursionlimit(old_limit)
    return sorted(found), finished


# ----------------------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------------------


def _int_option(name: str, value: Any, low: int, high: int | None = None) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"option {name} must be an integer, got {value!r}") from None
    if high is None and number < low:
        raise UsageError(f"option {name} must be at least {low}, got {number}")
    if high is not None and not low <= number <= high:
        raise UsageError(f"option {name} must be in {low}..{high}, got {number}")
    return number


class GraphColoringTask(Task):
    """K-colouring of Erdős–Rényi graphs G(n, p), kept only when K-colourable (GRAM protocol).

    Options: ``n`` (vertices, default 8), ``colors`` (K, default 3; any number for ``solve --exact`` and
    ``check``, at most :data:`MODEL_COLORS` for datasets and models), ``p`` (edge probability, default 0.5),
    ``train_size``/``test_size`` (distinct graphs, default 7000 / 255 as in GRAM for n = 8).
    """

    name = "graph-coloring"
    multi_solution = True
    reports_conflicts = True
    drawable = True

    def __init__(
        self,
        n: int | str | None = None,
        colors: int | str = 3,
        p: float | str = 0.5,
        train_size: int | str = 7000,
        test_size: int | str = 255,
    ) -> None:
        self.n_given = n is not None
        self.n = _int_option("n", 8 if n is None else n, 2, 12)  # datasets enumerate all K^n colourings
        self.colors = _int_option("colors", colors, 1)
        try:
            self.p = float(p)
        except (TypeError, ValueError):
            raise UsageError(f"option p must be a number, got {p!r}") from None
        if not 0.0 < self.p < 1.0:
            raise UsageError(f"option p must be between 0 and 1, got {self.p}")
        self.train_size = _int_option("train_size", train_size, 0, 10**7)
        self.test_size = _int_option("test_size", test_size, 0, 10**7)
        self.edges_len = self.n * (self.n - 1) // 2
        self.seq_len = self.edges_len + self.n
        self.vocab_size = COLOR0 + self.colors

    # -- the GRAM dataset -------------------------------------------------------------------------------
    def graphs(self, split: str, count: int, seed: int = 0) -> Iterator[Graph]:
        """``count`` distinct K-colourable G(n, p) graphs of ``split``, in a deterministic order for ``seed``.

        A graph belongs to the test split when a hash of its adjacency (salted by ``seed``) falls in 15% of
        the buckets, so the splits never share a graph, whatever sizes are asked for.
        """
        if split not in ("train", "test"):
            raise UsageError(f"split must be 'train' or 'test', got {split!r}")
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        seen: set[bytes] = set()
        produced = attempts = 0
        while produced < count:
            attempts += 1
            if attempts > 100 * count + 100_000:
                raise UsageError(
                    f"found only {produced} distinct {self.colors}-colourable graphs on {self.n} vertices for the "
                    f"{split} split; ask for fewer"
                )
            bits = rng.random(self.edges_len) < self.p
            key = np.packbits(bits).tobytes()
            if key in seen or (zlib.crc32(key, seed & 0xFFFFFFFF) % 20 < 3) != (split == "test"):
                continue
            seen.add(key)
            graph = Graph.from_upper_triangle(bits, self.n)
            if len(all_colorings_small(graph, self.colors)):
                produced += 1
                yield graph

    def _split_graphs(self, split: str, seed: int, size: int | None) -> Iterator[Graph]:
        default = self.train_size if split == "train" else self.test_size
        return self.graphs(split, default if size is None else size, seed)

    def examples(self, split: str, seed: int = 0) -> Iterator[tuple[Graph, tuple[int, ...]]]:
        """``(graph, canonical colouring)`` for each graph of ``split`` and each of its canonical colourings."""
        for graph in self._split_graphs(split, seed, None):
            for coloring in all_colorings_small(graph, self.colors):
                yield graph, tuple(int(c) for c in coloring)

    def records(self, split: str, seed: int, size: int | None) -> Iterator[tuple[Any, ...]]:
        """Dataset rows: one per (graph, canonical colouring); puzzle and group are the graph."""
        for index, graph in enumerate(self._split_graphs(split, seed, size)):
            inputs = self.encode(graph)
            for coloring in all_colorings_small(graph, self.colors):
                yield inputs, self.encode(tuple(int(c) for c in coloring)), index, index, None

    # -- tokens and checks ------------------------------------------------------------------------------
    def check_model_colors(self) -> None:
        """A one-line error unless a learned model's vocabulary can hold the task's colours (its tokens, its
        datasets and models need it; the exact solver and the verifier do not)."""
        if self.colors > MODEL_COLORS:
            raise UsageError(
                f"option colors must be in 1..{MODEL_COLORS} for a learned model (its vocabulary has one token "
                f"per colour), got {self.colors}; solve --exact and check take any number of colours"
            )

    def encode(self, puzzle: Graph | tuple[int, ...]) -> np.ndarray:
        """A graph -> adjacency tokens and unknown colours; a colouring -> pad over the adjacency, then colours."""
        self.check_model_colors()
        tokens = np.full(self.seq_len, PAD, dtype=np.uint8)
        if isinstance(puzzle, Graph):
            if puzzle.n != self.n:
                raise UsageError(f"the graph has {puzzle.n} vertices, the task {self.n}")
            tokens[: self.edges_len] = np.where(puzzle.upper_triangle(), EDGE, NO_EDGE)
            tokens[self.edges_len :] = UNKNOWN
            return tokens
        coloring = np.asarray(puzzle)
        if coloring.shape != (self.n,) or coloring.min() < 0 or coloring.max() >= self.colors:
            raise UsageError(f"not a colouring of {self.n} vertices with colours 0..{self.colors - 1}")
        tokens[self.edges_len :] = COLOR0 + coloring
        return tokens

    def decode(self, tokens: np.ndarray) -> Graph | tuple[int, ...]:
        """Inverse of :meth:`encode`: a colouring when the adjacency part is all pad, else the graph."""
        tokens = np.asarray(tokens)
        if (tokens[: self.edges_len] == PAD).all() and self.edges_len:
            return self.decode_answer(tokens)
        return Graph.from_upper_triangle(tokens[: self.edges_len] == EDGE, self.n)

    def decode_answer(self, tokens: np.ndarray) -> tuple[int, ...]:
        """The colouring in the vertex slots of ``tokens`` (-1 where a slot holds no colour token)."""
        slots = np.asarray(tokens)[self.edges_len :].astype(int) - COLOR0
        return tuple(int(c) if 0 <= c < self.colors else -1 for c in slots)

    @property
    def lists_completions(self) -> bool:  # type: ignore[override]
        """Every proper colouring under every naming of its colours can be listed, up to ``NAMED_COLORS``."""
        return self.colors <= NAMED_COLORS

    def nearest_completion(self, inputs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Each graph's proper colouring, under any naming of its colours, with the highest log-probability under
        ``logits`` (the sum over its vertices), as answer tokens ``[B, L]``: pad over the adjacency, then the
        colours."""
        if not self.lists_completions:
            raise UsageError(
                f"nearest completions name the colours every way: at most {NAMED_COLORS} colours"
            )
        log_probs = torch.log_softmax(logits.float(), -1)[:, self.edges_len :, COLOR0 : COLOR0 + self.colors]
        namings = torch.tensor(list(itertools.permutations(range(self.colors))), device=logits.device)
        nearest = torch.full((len(inputs), self.seq_len), PAD, dtype=torch.long, device=inputs.device)
        vertices = torch.arange(self.n, device=logits.device)
        for row, tokens in enumerate(inputs.cpu().numpy()):
            graph = Graph.from_upper_triangle(tokens[: self.edges_len] == EDGE, self.n)
            canonical = torch.from_numpy(all_colorings_small(graph, self.colors).astype(np.int64)).to(
                logits.device
            )
            candidates = namings[:, canonical].reshape(-1, self.n)  # [namings * colourings, n]
            best = candidates[log_probs[row][vertices, candidates].sum(-1).argmax()]
            nearest[row, self.edges_len :] = COLOR0 + best.to(nearest.device)
        return nearest

    def answer_key(self, answer: tuple[int, ...]) -> Hashable:
        """The canonical colouring: colourings that differ only by a renaming of colours share it. A colouring
        with an uncoloured vertex (-1) keeps its colours as they are."""
        return canonical(answer) if min(answer) >= 0 else tuple(answer)

    def verify(self, puzzle: Graph, answer: tuple[int, ...]) -> bool:
        """True when every vertex has a colour in ``0..K-1`` and no edge joins two equal colours."""
        return self.violations(puzzle, answer) == 0

    def violations(self, puzzle: Graph, answer: tuple[int, ...]) -> int:
        """Conflict edges plus vertices without a valid colour."""
        if len(answer) != puzzle.n:
            raise UsageError(f"the colouring has {len(answer)} entries, the graph {puzzle.n} vertices")
        invalid = sum(1 for c in answer if not 0 <= c < self.colors)
        return conflicts(puzzle, answer) + invalid

    def solutions(self, puzzle: Graph, limit: int | None = None) -> list[tuple[int, ...]]:
        """Every canonical proper colouring (at most ``limit``)."""
        if puzzle.n <= 12:
            found = [tuple(int(c) for c in row) for row in all_colorings_small(puzzle, self.colors)]
            return found if limit is None else found[:limit]
        return color_graph(puzzle, self.colors, limit)[0]

    def solve(self, puzzle: Graph, limit: int | None = 1, max_nodes: int = 2_000_000):
        """Exact search: ``(canonical colourings, finished)`` (see :func:`color_graph`)."""
        return color_graph(puzzle, self.colors, limit, max_nodes)

    def solve_exact(self, puzzle: Graph, list_all: bool = False, limit: int | None = None) -> ExactSolution:
        """DSATUR search (:func:`color_graph`): a colouring or proof that none exists, or every canonical
        colouring (at most ``limit``); "undecided" when the search gave up."""
        found, finished = self.solve(puzzle, limit=limit if list_all else 1)
        k = self.colors
        payload: dict[str, Any] = {
            "colors": k,
            "vertices": puzzle.n,
            "edges": len(puzzle.edges),
            "finished": finished,
        }
        if not found and not finished:
            payload["colorable"] = None
            return ExactSolution(payload, f"undecided: the search for a {k}-colouring gave up", False)
        payload["colorable"] = bool(found)
        if not found:
            return ExactSolution(payload, f"no {k}-colouring exists", False)
        if list_all:
            payload.update(count=len(found), colorings=[self.format(c) for c in found])
            return ExactSolution(payload, "\n".join([*payload["colorings"], f"count: {len(found)}"]), True)
        payload["coloring"] = list(found[0])
        return ExactSolution(payload, f"{k}-colouring: {self.format(found[0])}", True)

    def parse(self, text: str) -> Graph:
        """A graph from any accepted text form (a ``.col`` path, upper-triangle bits or an edge list)."""
        return parse_graph(text, self.n if self.n_given else None)

    def parse_answer(self, text: str, puzzle: Graph | None = None) -> tuple[int, ...]:
        """A colouring of ``puzzle``'s vertices."""
        return parse_coloring(text, puzzle.n if puzzle is not None else self.n, self.colors)

    def format(self, answer: tuple[int, ...] | Graph, pretty: bool = False) -> str:
        """Colours as digits (separated by commas when one is 10 or more), or a graph as its edge list (one
        line either way)."""
        if isinstance(answer, Graph):
            return ",".join(f"{u}-{v}" for u, v in answer.edges)
        return ("," if max(answer, default=0) >= 10 else "").join(str(c) for c in answer)

    def draw(self, ax: Any, puzzle: Graph, answer: tuple[int, ...]) -> None:
        """The graph on a circle, vertices in their colours (grey: none), edges whose ends share a colour red."""
        angle = 2 * np.pi * np.arange(puzzle.n) / puzzle.n
        x, y = np.sin(angle), np.cos(angle)
        for u, v in puzzle.edges:
            clash = answer[u] == answer[v] and answer[u] >= 0
            ax.plot([x[u], x[v]], [y[u], y[v]], color="tab:red" if clash else "0.6", lw=2 if clash else 0.8)
        palette = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
        colors = [palette[c % len(palette)] if c >= 0 else "0.8" for c in answer]
        ax.scatter(x, y, s=120, c=colors, edgecolors="black", zorder=2)
        ax.set(xlim=(-1.25, 1.25), ylim=(-1.25, 1.25), aspect="equal", xticks=[], yticks=[])

    def metadata(self) -> dict[str, Any]:
        """What a dataset's metadata.json records about this task."""
        return {
            "n": self.n,
            "colors": self.colors,
            "p": self.p,
            "adjacency_tokens": self.edges_len,
            "tokens": {"pad": PAD, "no_edge": NO_EDGE, "edge": EDGE, "unknown": UNKNOWN, "color c": "4 + c"},
        }
