"""Maze-Hard: the generator, the BFS solver against an independent shortest-path search, the verifier rule by
rule, the text form and the official token ids, and the command line."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import yaml
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from latentloop.cli import main
from latentloop.data.dataset import build_dataset
from latentloop.errors import UsageError
from latentloop.tasks.base import get_task
from latentloop.tasks.maze import (
    CHARSET,
    PATH,
    TOKEN_OF_CHAR,
    MazeTask,
    count_shortest_paths,
    in_test_split,
    parse_maze,
    solve_maze,
)
from tests.tiny import TINY_REASONER, tiny_run

# Two routes from S to G: along row 1 (4 moves) and round the block through row 3 (8 moves).
TWO_ROUTES = "#######\n#S   G#\n# ### #\n#     #\n#######\n#######\n#######"
# The same with a wall cutting row 1: only the long route is left.
WALLED = "#######\n#S # G#\n# ### #\n#     #\n#######\n#######\n#######"
# S and G at opposite corners of a ring round one wall: two shortest paths of 4 moves.
RING = "#####\n#S  #\n# # #\n#  G#\n#####"
# An open 3x3 room: the shortest paths from corner to corner are the C(4, 2) = 6 orders of 2 rights, 2 downs.
ROOM = "#####\n#S  #\n#   #\n#  G#\n#####"


def bfs_by_hand(text: str) -> int | None:
    """The S-G distance by scipy's shortest-path search on the grid graph of the non-wall cells (no code shared
    with the task): None when G is unreachable."""
    rows = text.split("\n")
    n = len(rows)
    cells = {(r, c): r * n + c for r in range(n) for c in range(n) if rows[r][c] != "#"}
    edges = [(cells[a], cells[b]) for a in cells for b in ((a[0] + 1, a[1]), (a[0], a[1] + 1)) if b in cells]
    graph = csr_matrix((np.ones(len(edges)), tuple(zip(*edges, strict=True))), shape=(n * n, n * n))
    start = next(r * n + c for r in range(n) for c in range(n) if rows[r][c] == "S")
    goal = next(r * n + c for r in range(n) for c in range(n) if rows[r][c] == "G")
    d = shortest_path(graph, directed=False, unweighted=True, indices=start)[goal]
    return None if np.isinf(d) else int(d)


def paths_by_hand(text: str) -> int:
    """Shortest S-G paths counted by trying every sequence of moves of the shortest length (tiny mazes)."""
    rows = text.split("\n")
    n, d = len(rows), bfs_by_hand(text)
    start = next((r, c) for r in range(n) for c in range(n) if rows[r][c] == "S")
    count = 0
    for moves in itertools.product(((0, 1), (1, 0), (0, -1), (-1, 0)), repeat=d):
        r, c = start
        seen = {start}
        for dr, dc in moves:
            r, c = r + dr, c + dc
            if not (0 <= r < n and 0 <= c < n) or rows[r][c] == "#" or (r, c) in seen:
                break
            seen.add((r, c))
        else:
            count += rows[r][c] == "G"
    return count


def mark(text: str, cells: list[tuple[int, int]], char: str = "o") -> str:
    rows = [list(row) for row in text.split("\n")]
    for r, c in cells:
        rows[r][c] = char
    return "\n".join("".join(row) for row in rows)


def judge(text: str, answer: str) -> int:
    task = MazeTask()
    puzzle = task.parse(text)
    return task.violations(puzzle, task.parse_answer(answer, puzzle))


# -- tokens ----------------------------------------------------------------------------------------------------
def test_tokens_are_the_official_builders_charset_index_plus_one() -> None:
    assert CHARSET == "# SGo"
    assert TOKEN_OF_CHAR == {"#": 1, " ": 2, "S": 3, "G": 4, "o": 5}
    # The official builder maps a CSV row's bytes through a table indexed by character code.
    table = np.zeros(256, np.uint8)
    table[np.array([ord(ch) for ch in "# SGo"])] = np.arange(1, 6)
    answer = "#######" + "#SoooG#" + "# ### #" + "#     #" + "#" * 21
    official = table[np.frombuffer(answer.encode(), dtype=np.uint8)]
    task = MazeTask(size=7)
    assert np.array_equal(task.encode(task.parse_answer(answer)), official)
    assert task.vocab_size == 6 and task.seq_len == 49


# -- the generator ---------------------------------------------------------------------------------------------
def test_generated_mazes_are_well_formed_and_as_hard_as_asked() -> None:
    task = MazeTask(size=11, min_length=18)
    for puzzle, answer in itertools.islice(task.examples("train", seed=3), 40):
        assert puzzle.shape == (11, 11) and set(np.unique(puzzle)) <= {1, 2, 3, 4}
        assert (puzzle == 3).sum() == 1 and (puzzle == 4).sum() == 1
        border = np.concatenate([puzzle[0], puzzle[-1], puzzle[:, 0], puzzle[:, -1]])
        assert (border == 1).all()
        assert bfs_by_hand(task.format(puzzle)) >= 18  # the hardness knob
        assert ((answer == puzzle) | ((answer == PATH) & (puzzle == 2))).all()  # only open cells marked
        assert task.verify(puzzle, answer)


def test_the_hardness_default_follows_maze_hard_and_an_impossible_one_is_refused() -> None:
    assert MazeTask().size == 30 and MazeTask().min_length == 111
    assert MazeTask(size=11).min_length == 15  # the same share of the grid's area
    lengths = [
        int((a == PATH).sum()) + 1 for _, a in itertools.islice(MazeTask(size=9).examples("train"), 30)
    ]
    assert min(lengths) >= 10
    with pytest.raises(UsageError, match="no 5x5 maze with a shortest path of at least 16 moves"):
        next(iter(MazeTask(size=5, min_length=16).examples("train")))
    for options in ({"size": 4}, {"size": "x"}, {"openness": 1.5}, {"size": 9, "n": 11}, {"min_length": 0}):
        with pytest.raises(UsageError):
            MazeTask(**options)


def test_generation_is_seeded_and_the_splits_never_share_a_maze() -> None:
    task = MazeTask(size=5, min_length=2)  # few possible mazes: repeats within a split are common

    def draw(split: str, seed: int, k: int) -> list[bytes]:
        return [p.tobytes() for p, _ in itertools.islice(task.examples(split, seed), k)]

    assert draw("train", 0, 20) == draw("train", 0, 20)
    assert draw("train", 0, 20) != draw("train", 1, 20)
    train, test = set(draw("train", 0, 600)), set(draw("test", 0, 150))
    assert len(train) > 20 and len(test) > 10
    assert not train & test
    shape = (5, 5)
    assert all(in_test_split(np.frombuffer(k, np.uint8).reshape(shape), 0) for k in test)


def test_several_shortest_paths_are_common_in_generated_mazes() -> None:
    counts = [count_shortest_paths(p) for p, _ in itertools.islice(MazeTask(size=15).examples("train"), 40)]
    assert min(counts) >= 1 and sum(c > 1 for c in counts) >= 8


# -- the solver ------------------------------------------------------------------------------------------------
def test_the_solvers_path_length_is_bfs_on_generated_mazes() -> None:
    for size in (9, 30):
        task = MazeTask(size=size)
        for puzzle, answer in itertools.islice(task.examples("test", seed=1), 15):
            text = task.format(puzzle)
            d = bfs_by_hand(text)
            solved = solve_maze(puzzle)
            assert int((solved == PATH).sum()) + 1 == d == int((answer == PATH).sum()) + 1
            payload, _, ok = task.solve_exact(puzzle)
            assert ok and payload["length"] == d


@pytest.mark.parametrize("text, count", [(TWO_ROUTES, 1), (WALLED, 1), (RING, 2), (ROOM, 6)])
def test_shortest_paths_are_counted_and_listed_exactly(text: str, count: int) -> None:
    task = MazeTask()
    puzzle = task.parse(text)
    assert count_shortest_paths(puzzle) == paths_by_hand(text) == count
    listed = task.solutions(puzzle)
    assert len({s.tobytes() for s in listed}) == count
    assert all(task.verify(puzzle, s) for s in listed)
    assert len(task.solutions(puzzle, limit=1)) == 1


def test_generated_path_counts_match_a_brute_force_count() -> None:
    task = MazeTask(size=7, min_length=6, openness=0.3)
    for puzzle, _ in itertools.islice(task.examples("train"), 25):
        assert count_shortest_paths(puzzle) == paths_by_hand(task.format(puzzle))


def test_an_unreachable_goal_has_no_answer() -> None:
    task = MazeTask()
    puzzle = task.parse("#####\n#S# #\n### #\n#  G#\n#####")
    payload, text, solved = task.solve_exact(puzzle)
    assert not solved and payload["count"] == 0 and text == "no path from S to G"
    assert task.solutions(puzzle) == []
    assert judge("#####\n#S# #\n### #\n#  G#\n#####", "#####\n#S#o#\n###o#\n#  G#\n#####") > 0


# -- the verifier ----------------------------------------------------------------------------------------------
def test_any_shortest_path_is_accepted() -> None:
    assert judge(TWO_ROUTES, mark(TWO_ROUTES, [(1, 2), (1, 3), (1, 4)])) == 0
    right_then_down = mark(RING, [(1, 2), (1, 3), (2, 3)])
    down_then_right = mark(RING, [(2, 1), (3, 1), (3, 2)])
    assert judge(RING, right_then_down) == judge(RING, down_then_right) == 0
    task = MazeTask()
    canonical = task.format(solve_maze(task.parse(RING)))
    assert canonical in (right_then_down, down_then_right)
    # Both routes at once are no path: three cells too many.
    assert judge(RING, mark(RING, [(1, 2), (1, 3), (2, 3), (2, 1), (3, 1), (3, 2)])) == 3


def test_a_second_shortest_path_of_a_generated_maze_is_accepted() -> None:
    task = MazeTask(size=15)
    mazes = itertools.islice(task.examples("train"), 100)
    puzzle = next(p for p, _ in mazes if count_shortest_paths(p) > 1)
    first, second = task.solutions(puzzle, limit=2)
    assert not np.array_equal(first, second)
    assert task.verify(puzzle, first) and task.verify(puzzle, second)


def test_each_broken_rule_is_refused_with_its_count() -> None:
    short = [(1, 2), (1, 3), (1, 4)]
    long = [(2, 1), (3, 1), (3, 2), (3, 3), (3, 4), (3, 5), (2, 5)]
    # A longer path: connected and simple, 7 inner cells where the shortest has 3.
    assert judge(TWO_ROUTES, mark(TWO_ROUTES, long)) == 4
    # The long route is the shortest once row 1 is walled, and then it is right.
    assert judge(WALLED, mark(WALLED, long)) == 0
    # A broken path: a gap splits it into two pieces and leaves it a cell short.
    assert judge(TWO_ROUTES, mark(TWO_ROUTES, [(1, 2), (1, 4)])) == 2
    # Through a wall: the wall cell is changed, and the cells either side of it are two pieces, 5 too few.
    assert judge(WALLED, mark(WALLED, short)) == 1 + 1 + 5
    # S or G moved (the path itself kept): two cells changed each time.
    moved_start = mark(mark(TWO_ROUTES, short), [(1, 1)], " ")
    assert judge(TWO_ROUTES, mark(moved_start, [(3, 1)], "S")) == 2
    moved_goal = mark(mark(TWO_ROUTES, short), [(1, 5)], " ")
    assert judge(TWO_ROUTES, mark(moved_goal, [(3, 5)], "G")) == 2
    # S removed: one changed cell.
    assert judge(TWO_ROUTES, mark(mark(TWO_ROUTES, short), [(1, 1)], " ")) == 1
    # An extra stray 'o': one more piece and one cell too many.
    assert judge(TWO_ROUTES, mark(TWO_ROUTES, [*short, (3, 3)])) == 2
    # A wall removed from an otherwise right answer.
    assert judge(TWO_ROUTES, mark(mark(TWO_ROUTES, short), [(2, 3)], " ")) == 1
    # Nothing marked: S and G apart, three cells missing.
    assert judge(TWO_ROUTES, TWO_ROUTES) == 4


def test_a_model_answer_with_pad_or_unknown_tokens_is_refused() -> None:
    task = MazeTask(size=7)
    puzzle = task.parse(TWO_ROUTES)
    answer = task.encode(task.parse_answer(mark(TWO_ROUTES, [(1, 2), (1, 3), (1, 4)])))
    assert task.verify(puzzle, task.decode(answer))
    for token in (0, 9):
        broken = answer.copy()
        broken[3 * 7 + 3] = token  # an open cell off the path
        assert task.violations(puzzle, task.decode(broken)) == 1


def test_augmented_rows_stay_mazes_with_a_shortest_path() -> None:
    task = MazeTask(size=9)
    rows = list(itertools.islice(task.records("train", 0, 16), 16))
    inputs, labels = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    before = inputs.copy()
    task.augment(inputs, labels, np.random.default_rng(0))
    assert not np.array_equal(inputs, before)
    for x, y in zip(inputs, labels, strict=True):
        assert task.verify(task.decode(x), task.decode(y))


# -- text form -------------------------------------------------------------------------------------------------
def test_parse_and_format_round_trip_in_every_form(tmp_path) -> None:
    task = MazeTask(size=11)
    puzzle, answer = next(iter(task.examples("train")))
    for grid, read in ((puzzle, task.parse), (answer, task.parse_answer)):
        text = task.format(grid)
        assert text.count("\n") == 10 and np.array_equal(read(text), grid)
        assert np.array_equal(read(text.replace("\n", "")), grid)  # the official flat form
        assert np.array_equal(read(text.replace("\n", "/").replace(" ", ".")), grid)
    path = tmp_path / "maze.txt"
    path.write_text(task.format(puzzle) + "\n")
    assert np.array_equal(MazeTask().parse(str(path)), puzzle)  # its own size: no option given


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("#S#\n#G", "row 2 of the maze has 2 cells, row 1 has 3"),
        ("#SG#\n####", "square grid"),
        ("SG#", "square number of cells"),
        ("#S#\n#x#\n#G#", r"unexpected character 'x' at row 2, column 2"),
        ("#S#\n#o#\n#G#", "a path cell 'o'"),
        ("#S#\n# #\n# #", r"exactly one G \(goal\), found 0"),
        ("SS\nG ", r"exactly one S \(start\), found 2"),
    ],
)
def test_malformed_mazes_get_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        MazeTask().parse(text)


def test_a_maze_of_another_size_than_asked_is_refused() -> None:
    with pytest.raises(UsageError, match=r"the maze is 5x5, the task's 9x9"):
        MazeTask(size=9).parse(RING)
    with pytest.raises(UsageError, match=r"the answer is 7x7, the task's 5x5"):
        MazeTask().parse_answer(TWO_ROUTES, parse_maze(RING))


# -- datasets and the command line -----------------------------------------------------------------------------
def test_a_dataset_records_each_mazes_length_and_path_count(tmp_path) -> None:
    task = get_task("maze", size="7", min_length="6")
    metadata = build_dataset(task, tmp_path / "data", size=12, test_size=4, progress=False)
    assert metadata["seq_len"] == 49 and metadata["vocab_size"] == 6
    assert metadata["counts"]["train"]["puzzles"] == 12 and metadata["counts"]["test"]["puzzles"] == 4
    assert metadata["task_info"]["tokens"] == {
        "pad": 0,
        "wall": 1,
        "open": 2,
        "start": 3,
        "goal": 4,
        "path": 5,
    }
    assert all(info["length"] >= 6 and info["shortest_paths"] >= 1 for info in metadata["puzzles"].values())


def test_solve_exact_and_check_on_the_command_line(capsys) -> None:
    assert main(["solve", "maze", RING, "--exact", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["length"] == 4 and payload["count"] == 2 and not payload["unique"]
    assert judge(RING, payload["solution"]) == 0
    assert main(["solve", "maze", RING.replace("\n", "/"), "--exact", "--all", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["count"] == 2 and len(set(listed["solutions"])) == 2
    assert main(["solve", "maze", "#####/#S# #/### #/#  G#/#####", "--exact"]) == 1
    assert capsys.readouterr().out.strip() == "no path from S to G"
    assert main(["check", "maze", RING, mark(RING, [(1, 2), (1, 3), (2, 3)])]) == 0
    assert main(["check", "maze", RING, mark(RING, [(1, 2), (1, 3)])]) == 1


@pytest.mark.parametrize("text", ["#S#/#x#/#G#", "#S#/#G", "#S#/# #/#S#"])
def test_a_malformed_maze_on_the_command_line_gets_one_line_and_exit_2(capsys, text: str) -> None:
    assert main(["solve", "maze", text, "--exact"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_a_reasoner_trains_evaluates_and_solves_mazes(tmp_path, capsys) -> None:
    run = tiny_run(TINY_REASONER, train={"steps": 2, "eval_size": 4, "train_size": 16, "test_size": 4})
    run["task"] = {"name": "maze", "size": 7, "min_length": 6}
    config = tmp_path / "trm-maze.yaml"
    config.write_text(yaml.safe_dump({"arch": "trm", **run}))
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--samples", "2", "--steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "maze" and report["puzzles"] == 4 and "coverage" in report
    assert main(["solve", "maze:size=7", TWO_ROUTES, "--model", str(tmp_path / "run"), "--json"]) in (0, 1)
