"""Graph colouring: text forms and DIMACS files, exact colouring vs brute force, the GRAM dataset."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latentloop.errors import UsageError
from latentloop.tasks import get_task
from latentloop.tasks import graph_coloring as G

SETTINGS = settings(max_examples=40, deadline=None)
TRIANGLE_PLUS = "0-1,1-2,2-0,2-3"


def _brute_force(graph: G.Graph, k: int) -> list[tuple[int, ...]]:
    """Every canonical proper colouring, by trying all k^n assignments."""
    found = set()
    for colors in itertools.product(range(k), repeat=graph.n):
        if G.conflicts(graph, colors) == 0:
            found.add(G.canonical(colors))
    return sorted(found)


@st.composite
def graphs(draw, max_n: int = 7) -> G.Graph:
    n = draw(st.integers(2, max_n))
    bits = draw(st.lists(st.booleans(), min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2))
    return G.Graph.from_upper_triangle(np.array(bits, dtype=bool), n)


def test_canonical_colouring_table() -> None:
    # Stirling numbers of the second kind: S(8,1) + S(8,2) + S(8,3) = 1 + 127 + 966.
    table = G.canonical_colorings(8, 3)
    assert len(table) == 1094 and len(G.canonical_colorings(10, 3)) == 9842
    assert all(G.canonical(row) == tuple(row) for row in table[::37])


@SETTINGS
@given(graph=graphs(), k=st.integers(1, 4))
def test_exact_colouring_matches_brute_force(graph: G.Graph, k: int) -> None:
    expected = _brute_force(graph, k)
    assert [tuple(int(c) for c in row) for row in G.all_colorings_small(graph, k)] == expected
    found, finished = G.color_graph(graph, k, limit=None)
    assert finished and found == expected
    first, _ = G.color_graph(graph, k, limit=1)
    assert (first and G.conflicts(graph, first[0]) == 0) or not expected


def test_text_forms(tmp_path) -> None:
    graph = G.parse_graph(TRIANGLE_PLUS)
    assert graph.n == 4 and graph.edges == ((0, 1), (0, 2), (1, 2), (2, 3))
    bits = "".join(str(int(b)) for b in graph.upper_triangle())
    assert bits == "110101" and G.parse_graph(bits) == graph
    assert G.parse_graph("0-1 1-2; 2-0 3-2") == graph
    path = tmp_path / "g.col"
    path.write_text("c a comment\np edge 4 4\ne 1 2\ne 2 3\ne 3 1\ne 3 4\ne 4 3\n")
    assert G.parse_graph(str(path)) == graph
    assert get_task("graph-coloring").parse(str(path)) == graph
    assert G.parse_graph("0-1", n=5).n == 5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("e 1 2\n", "malformed DIMACS line"),
        ("p edge 3 1\ne 1 x\n", "malformed DIMACS line"),
        ("p edge 3 1\ne 1 4\n", "outside"),
        ("p edge 3 1\ne 2 2\n", "self-loop"),
        ("c only a comment\n", "no 'p edge"),
        ("p edge 3 1\nq 1 2\n", "malformed"),
    ],
)
def test_malformed_col_files(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "bad.col"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        G.parse_graph(str(path))


def test_unreadable_inputs(tmp_path) -> None:
    with pytest.raises(UsageError, match="cannot read graph file"):
        G.parse_graph(str(tmp_path / "missing.col"))
    (tmp_path / "binary.col").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="cannot read graph file"):
        G.parse_graph(str(tmp_path / "binary.col"))
    with pytest.raises(UsageError, match="n\\(n-1\\)/2"):
        G.parse_graph("1101")
    with pytest.raises(UsageError, match="cannot read 'a-b'"):
        G.parse_graph("a-b")
    with pytest.raises(UsageError, match="option n says 8"):
        get_task("graph-coloring", n="8").parse("110101")
    with pytest.raises(UsageError, match="10 vertices, option n says 8"):
        get_task("graph-coloring", n="8").parse("0-9")
    assert get_task("graph-coloring", n="8").parse(TRIANGLE_PLUS).n == 8  # isolated vertices 4..7


def test_colouring_text_and_checks() -> None:
    task = get_task("graph-coloring", colors="3")
    graph = task.parse(TRIANGLE_PLUS)
    assert task.verify(graph, task.parse_answer("0120", graph))
    assert task.parse_answer("0, 1, 2, 0", graph) == (0, 1, 2, 0)
    assert task.violations(graph, (0, 0, 2, 0)) == 1
    assert task.violations(graph, (0, 1, 2, 5)) == 1  # colour out of range
    with pytest.raises(UsageError, match="4 vertices"):
        task.parse_answer("012", graph)
    with pytest.raises(UsageError, match="colour number"):
        task.parse_answer("01a0", graph)


def test_any_number_of_colours_for_the_solver_and_the_verifier_ten_for_a_model() -> None:
    task = get_task("graph-coloring", colors="12")
    k12 = G.Graph.from_edges(12, itertools.combinations(range(12), 2))
    [coloring] = task.solutions(k12)
    assert coloring == tuple(range(12)) and task.verify(k12, coloring)
    assert task.format(coloring) == "0,1,2,3,4,5,6,7,8,9,10,11"  # digits alone would be ambiguous from 10 on
    assert task.parse_answer(task.format(coloring), k12) == coloring
    assert task.parse_answer("0" * 12, k12) == (0,) * 12 and task.format((0, 1, 2)) == "012"
    assert task.violations(k12, (*range(11), 12)) == 1  # colour 12 is out of range for K = 12
    with pytest.raises(UsageError, match=r"1\.\.10 for a learned model .*solve --exact and check take any"):
        task.encode(k12)  # a model's vocabulary: one token per colour
    assert len(get_task("graph-coloring", colors="10").encode(G.Graph.from_edges(8, [(0, 1)]))) == 36


def test_large_graph_search() -> None:
    # The Grötzsch-like Mycielski graph M4 (11 vertices) needs 4 colours.
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]
    edges += [(5 + i, j) for i in range(5) for j in ((i + 1) % 5, (i - 1) % 5)]
    edges += [(10, 5 + i) for i in range(5)]
    graph = G.Graph.from_edges(11, edges)
    assert G.color_graph(graph, 3) == ([], True)
    found, finished = G.color_graph(graph, 4)
    assert finished and G.conflicts(graph, found[0]) == 0
    assert G.color_graph(graph, 3, max_nodes=5)[1] is False  # gave up


def test_gram_dataset_sizes_n8() -> None:
    task = get_task("graph-coloring", n=8, colors=3)
    train = list(task._split_graphs("train", 0, None))
    test = list(task._split_graphs("test", 0, None))
    assert len(train) == 7000 and len(test) == 255  # GRAM: ~7,000 / 255 graphs for n = 8
    keys = {g.upper_triangle().tobytes() for g in train + test}
    assert len(keys) == 7255  # distinct graphs, no overlap between the splits
    for graph in test:
        colorings = G.all_colorings_small(graph, 3)
        assert len(colorings) >= 1  # kept only when 3-colourable
        assert all(G.canonical(c) == tuple(c) and G.conflicts(graph, c) == 0 for c in colorings)


def test_dataset_n10_and_determinism() -> None:
    task = get_task("graph-coloring", n=10, train_size=50, test_size=10)
    first = [g.edges for g in task._split_graphs("train", 3, None)]
    assert len(first) == 50 and first == [g.edges for g in task._split_graphs("train", 3, None)]
    rows = list(task.records("test", 3, None))
    assert len({r[2] for r in rows}) == 10 and len(rows[0][0]) == 45 + 10


@SETTINGS
@given(graph=graphs(max_n=8))
def test_encode_decode_round_trip(graph: G.Graph) -> None:
    task = get_task("graph-coloring", n=graph.n)
    tokens = task.encode(graph)
    assert len(tokens) == graph.n * (graph.n - 1) // 2 + graph.n
    assert task.decode(tokens) == graph
    for coloring in G.all_colorings_small(graph, 3)[:3]:
        coloring = tuple(int(c) for c in coloring)
        assert task.decode(task.encode(coloring)) == coloring


@SETTINGS
@given(graph=graphs(max_n=8), vertex=st.integers(0, 7))
def test_corrupted_colouring_is_rejected(graph: G.Graph, vertex: int) -> None:
    task = get_task("graph-coloring", n=graph.n)
    colorings = G.all_colorings_small(graph, 3)
    neighbours = graph.neighbours()
    vertex %= graph.n
    if not len(colorings) or not neighbours[vertex]:
        return
    coloring = list(int(c) for c in colorings[0])
    assert task.verify(graph, tuple(coloring))
    coloring[vertex] = coloring[min(neighbours[vertex])]  # clash with a neighbour
    assert not task.verify(graph, tuple(coloring)) and task.violations(graph, tuple(coloring)) >= 1


@pytest.mark.parametrize(
    "options", [{"n": "1"}, {"n": "13"}, {"colors": "0"}, {"p": "1.5"}, {"p": "x"}, {"train_size": "-1"}]
)
def test_bad_options(options: dict[str, str]) -> None:
    with pytest.raises(UsageError):
        get_task("graph-coloring", **options)


def test_draw_marks_edges_whose_ends_share_a_colour() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    task = get_task("graph-coloring", n=4)
    graph = G.Graph(4, ((0, 1), (1, 2), (2, 3)))
    fig, ax = plt.subplots()
    task.draw(ax, graph, (0, 1, 1, 0))
    colours = [to_hex(line.get_color()) for line in ax.lines]
    plt.close(fig)
    assert colours.count(to_hex("tab:red")) == 1 and len(colours) == 3  # only edge 1-2 clashes


def test_the_nearest_completion_is_the_likeliest_proper_colouring_under_any_naming():
    """Path 0-1-2, three colours. Vertex 0 leans to colour 0, vertex 1 to colour 0 then 2, vertex 2 to colour 1:
    the likeliest proper colouring is (0, 2, 1), not the improper (0, 0, 1)."""
    import torch

    task = get_task("graph-coloring", n=3, colors=3)
    path = G.Graph.from_edges(3, [(0, 1), (1, 2)])
    inputs = torch.from_numpy(np.stack([task.encode(path)] * 2).astype(np.int64))
    logits = torch.zeros(2, task.seq_len, task.vocab_size)
    leanings = [[5.0, 0.0, 0.0], [4.0, 0.0, 2.0], [0.0, 5.0, 0.0]]
    logits[0, task.edges_len :, 4:7] = torch.tensor(leanings)
    logits[1, task.edges_len :, 4:7] = torch.tensor(leanings)[:, [2, 0, 1]]  # the same leanings, renamed
    nearest = task.nearest_completion(inputs, logits)
    assert task.decode_answer(nearest[0].numpy()) == (0, 2, 1)
    assert task.decode_answer(nearest[1].numpy()) == (1, 0, 2)  # colour c renamed to [1, 2, 0][c]
    assert (nearest[:, : task.edges_len] == 0).all() and task.verify(path, (1, 0, 2))
    assert task.lists_completions and not get_task("graph-coloring", n=6, colors=6).lists_completions
