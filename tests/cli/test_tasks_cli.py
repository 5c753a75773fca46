"""The task commands: data build, check, solve (exit 0 / 1 / 2, one-line errors, nothing written on error)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from latentloop.cli import main
from latentloop.tasks.base import get_task

CLASSIC = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_usage_error(code: int, out: str, err: str) -> None:
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1


def test_check_exit_codes(capsys) -> None:
    code, out, _ = run(capsys, "check", "sudoku", CLASSIC, SOLUTION, "--json")
    assert code == 0 and json.loads(out) == {"valid": True, "violations": 0}
    wrong = SOLUTION[:-1] + ("1" if SOLUTION[-1] != "1" else "2")
    code, out, _ = run(capsys, "check", "sudoku", CLASSIC, wrong, "--json")
    assert code == 1 and json.loads(out)["valid"] is False and json.loads(out)["violations"] > 0
    code, out, _ = run(capsys, "check", "sudoku", CLASSIC, SOLUTION)
    assert code == 0 and out.strip() == "valid"


def test_check_nqueens_and_graph(capsys, tmp_path) -> None:
    board = "Q" + "." * 15
    code, out, _ = run(capsys, "check", "nqueens", "." * 16, "..Q.Q......Q.Q..", "--n", "4", "--json")
    assert code == 0 and json.loads(out)["valid"]
    code, out, _ = run(capsys, "check", "nqueens:n=4", board, "..Q.Q......Q.Q..", "--json")
    assert code == 1  # the given queen was dropped
    col = tmp_path / "tri.col"
    col.write_text("p edge 3 3\ne 1 2\ne 2 3\ne 1 3\n")
    code, out, _ = run(capsys, "check", "graph-coloring", str(col), "012", "--json")
    assert code == 0 and json.loads(out) == {"valid": True, "violations": 0}
    code, out, _ = run(capsys, "check", "graph-coloring", str(col), "011", "--json")
    assert code == 1 and json.loads(out) == {"valid": False, "violations": 1}


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "sudoku", CLASSIC[:-1], SOLUTION],  # wrong length
        ["check", "sudoku", CLASSIC[:-1] + "x", SOLUTION],  # stray character
        ["check", "sudoku", "55" + CLASSIC[2:], SOLUTION],  # clashing givens
        ["check", "sudoku", CLASSIC, SOLUTION[:-1]],  # answer of the wrong length
        ["check", "nqueens", "QQ" + "." * 62, "." * 64],  # attacking given queens
        ["check", "graph-coloring", "0-1,1-2", "01"],  # colouring of the wrong length
        ["check", "sudok", CLASSIC, SOLUTION],  # unknown task
        ["check", "sudoku:size=9", CLASSIC, SOLUTION],  # unknown option
        ["check", "sudoku", CLASSIC, SOLUTION, "--tier", "insane"],  # bad option value
        ["check", "sudoku", CLASSIC, SOLUTION, "stray"],  # stray argument
        ["solve", "sudoku", "." * 49],  # no shipped model takes this size
        ["solve", "sudoku", CLASSIC, "--model", "runs/x"],  # not available yet
        ["solve", "arc-agi-1", "007bbfb7", "--exact"],  # no exact solver
        ["solve", "graph-coloring", "/no/such/graph.col", "--exact"],  # unreadable .col
        ["solve", "nqueens", "." * 63, "--exact"],
        ["solve", "nqueens", "Q" + "." * 63, "--all", "--limit", "3"],  # --limit is the exact list's
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv: list[str]) -> None:
    _assert_usage_error(*run(capsys, *argv))


def test_malformed_col_file(capsys, tmp_path) -> None:
    col = tmp_path / "bad.col"
    col.write_text("p edge 3 1\ne 1 nine\n")
    _assert_usage_error(*run(capsys, "solve", "graph-coloring", str(col), "--exact"))
    _assert_usage_error(*run(capsys, "check", "graph-coloring", str(col), "012"))


def test_solve_sudoku(capsys) -> None:
    code, out, _ = run(capsys, "solve", "sudoku", CLASSIC, "--exact", "--json")
    assert code == 0
    assert json.loads(out) == {"solution": SOLUTION, "count": 1, "unique": True, "guesses": 0}
    code, out, _ = run(capsys, "solve", "sudoku", CLASSIC, "--exact")
    assert code == 0 and f"solution: {SOLUTION}" in out and "count: 1 (unique)" in out and "guesses: 0" in out
    code, out, _ = run(capsys, "solve", "sudoku", "." * 81, "--exact", "--json")
    assert code == 0 and json.loads(out)["count"] == 2 and not json.loads(out)["unique"]
    code, out, _ = run(capsys, "solve", "sudoku", "12345678." + "........9" + "." * 63, "--exact", "--json")
    assert code == 1 and json.loads(out)["solution"] is None
    code, out, _ = run(capsys, "solve", "sudoku", "." * 16, "--n", "4", "--exact", "--all", "--json")
    assert code == 0 and json.loads(out)["count"] == 288


def test_solve_nqueens_all(capsys) -> None:
    code, out, _ = run(capsys, "solve", "nqueens", "." * 64, "--exact", "--all", "--json")
    result = json.loads(out)
    assert code == 0 and result["count"] == 92 and len(set(result["solutions"])) == 92
    code, out, _ = run(capsys, "solve", "nqueens", "." * 64, "--exact", "--all")
    assert out.strip().splitlines()[-1] == "count: 92"
    code, out, _ = run(capsys, "solve", "nqueens", "." * 9, "--n", "3", "--exact")
    assert code == 1 and "no solution" in out


def test_solve_graph_coloring(capsys, tmp_path) -> None:
    k4 = "0-1,0-2,0-3,1-2,1-3,2-3"
    code, out, _ = run(capsys, "solve", "graph-coloring", k4, "--exact", "--colors", "3", "--json")
    assert code == 1 and json.loads(out)["colorable"] is False
    code, out, _ = run(capsys, "solve", "graph-coloring", k4, "--exact", "--colors", "4", "--json")
    assert code == 0 and json.loads(out)["coloring"] == [0, 1, 2, 3]
    col = tmp_path / "c5.col"
    col.write_text("c five-cycle\np edge 5 5\ne 1 2\ne 2 3\ne 3 4\ne 4 5\ne 5 1\n")
    code, out, _ = run(capsys, "solve", "graph-coloring", str(col), "--exact", "--all", "--json")
    assert code == 0 and json.loads(out)["count"] == 5  # the canonical proper 3-colourings of C5
    code, out, _ = run(capsys, "solve", "graph-coloring", str(col), "--exact")
    assert code == 0 and out.startswith("3-colouring: ")


def planted_graph(colors: int, per_color: int, p: float, seed: int) -> tuple[int, list[tuple[int, int]]]:
    """A graph of chromatic number ``colors``: vertices split into ``colors`` classes with random edges between
    classes (so ``colors`` colours suffice), one vertex of each class joined into a clique (so none fewer do),
    the vertices numbered in a random order."""
    rng = np.random.default_rng(seed)
    n = colors * per_color
    cls = np.arange(n) % colors
    edges = {(u, v) for u in range(n) for v in range(u + 1, n) if cls[u] != cls[v] and rng.random() < p}
    edges |= set(itertools.combinations(range(colors), 2))
    order = rng.permutation(n)
    return n, sorted((int(order[u]), int(order[v])) for u, v in edges)


def test_solve_graph_coloring_with_more_than_ten_colours(capsys, tmp_path) -> None:
    n, edges = planted_graph(colors=11, per_color=5, p=0.4, seed=0)  # chromatic number 11
    col = tmp_path / "chi11.col"
    col.write_text(
        f"c chromatic number 11\np edge {n} {len(edges)}\n"
        + "".join(f"e {u + 1} {v + 1}\n" for u, v in edges)
    )
    code, out, _ = run(capsys, "solve", "graph-coloring", str(col), "--exact", "--colors", "11", "--json")
    result = json.loads(out)
    assert code == 0 and result["colorable"] and len(set(result["coloring"])) == 11
    task = get_task("graph-coloring", colors=11)
    graph = task.parse(str(col))
    assert graph.n == 55 and task.verify(graph, tuple(result["coloring"]))
    code, out, _ = run(capsys, "solve", "graph-coloring", str(col), "--exact", "--colors", "11")
    answer = out.strip().removeprefix("11-colouring: ")
    assert code == 0 and "," in answer  # colour 10 is written with separators
    code, out, _ = run(capsys, "check", "graph-coloring", str(col), answer, "--colors", "11", "--json")
    assert code == 0 and json.loads(out) == {"valid": True, "violations": 0}
    # Ten colours: refused as uncolourable, as any graph without a colouring is.
    code, out, _ = run(capsys, "solve", "graph-coloring", str(col), "--exact", "--colors", "10", "--json")
    assert code == 1 and json.loads(out)["colorable"] is False and json.loads(out)["finished"]
    code, out, _ = run(capsys, "solve", "graph-coloring", str(col), "--exact", "--colors", "10")
    assert code == 1 and out.strip() == "no 10-colouring exists"
    # A learned model's vocabulary caps the colours, and its error says so.
    code, out, err = run(
        capsys, "data", "build", "graph-coloring", "--colors", "11", "--out", str(tmp_path / "d")
    )
    _assert_usage_error(code, out, err)
    assert "for a learned model" in err and not (tmp_path / "d").exists()


def test_solve_nqueens_infers_the_board_size_from_a_square_cell_count(capsys) -> None:
    code, out, _ = run(capsys, "solve", "nqueens", "." * 36, "--exact", "--all", "--json")
    result = json.loads(out)
    six = get_task("nqueens", n=6)
    assert code == 0 and result["count"] == 4 and len(set(result["solutions"])) == 4
    assert all(six.verify(six.parse("." * 36), six.parse_answer(board)) for board in result["solutions"])
    code, out, _ = run(capsys, "solve", "nqueens", "." * 36, "--exact", "--all")
    assert code == 0 and out.strip().splitlines()[-1] == "count: 4"
    code, out, _ = run(capsys, "check", "nqueens", "." * 36, result["solutions"][0])
    assert code == 0 and out.strip() == "valid"
    code, out, err = run(capsys, "solve", "nqueens", "." * 35, "--exact", "--all")
    _assert_usage_error(code, out, err)
    assert "square number of cells" in err and "got 35" in err


def test_data_build(capsys, tmp_path) -> None:
    out_dir = tmp_path / "gc"
    code, out, _ = run(
        capsys,
        "data",
        "build",
        "graph-coloring",
        "--out",
        str(out_dir),
        "--n",
        "8",
        "--colors",
        "3",
        "--size",
        "40",
        "--test-size",
        "10",
        "--seed",
        "3",
        "--json",
    )
    counts = json.loads(out)
    assert code == 0 and counts["train"]["puzzles"] == 40 and counts["test"]["puzzles"] == 10
    assert (out_dir / "metadata.json").exists() and (out_dir / "train" / "inputs.npy").exists()
    code, out, _ = run(capsys, "data", "build", "nqueens:n=6", "--out", str(tmp_path / "nq"))
    assert code == 0 and "train:" in out and "test:" in out


@pytest.mark.parametrize(
    "extra",
    [
        ["sudok"],
        ["sudoku", "--tier", "insane"],
        ["nqueens:n=x"],
        ["nqueens", "--size", "0"],
        ["graph-coloring", "--colors", "many"],
        ["digits", "--path", "/no/such/mnist.npz"],
        ["sudoku", "--data", "/no/such.csv"],
    ],
)
def test_data_build_bad_input_writes_nothing(capsys, tmp_path, extra: list[str]) -> None:
    target = tmp_path / "out"
    _assert_usage_error(*run(capsys, "data", "build", *extra, "--out", str(target)))
    assert list(tmp_path.iterdir()) == []


def test_data_build_into_an_unwritable_place_is_one_line(capsys, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    _assert_usage_error(*run(capsys, "data", "build", "nqueens:n=5", "--out", str(blocker / "sub")))
    assert list(tmp_path.iterdir()) == [blocker]


def test_a_file_system_error_in_any_command_is_one_line(capsys, tmp_path, monkeypatch) -> None:
    import latentloop.data.dataset as dataset

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "out"))

    monkeypatch.setattr(dataset, "build_dataset", full_disk)
    code, out, err = run(capsys, "data", "build", "nqueens:n=5", "--out", str(tmp_path / "out"))
    _assert_usage_error(code, out, err)
    assert "No space left on device" in err and str(tmp_path / "out") in err


def test_data_build_from_malformed_csv_writes_nothing(capsys, tmp_path) -> None:
    csv_path = tmp_path / "extreme.csv"
    csv_path.write_text(f"source,q,a,rating\nx,{CLASSIC},{SOLUTION},3\ny,{CLASSIC[:-1]},{SOLUTION},4\n")
    target = tmp_path / "out"
    _assert_usage_error(
        *run(
            capsys, "data", "build", "sudoku", "--data", str(csv_path), "--tier", "any", "--out", str(target)
        )
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["extreme.csv"]
    csv_path.write_text("source,q,a,rating\n" + f"x,{CLASSIC},{SOLUTION},3\n" * 4)
    code, out, _ = run(
        capsys,
        "data",
        "build",
        "sudoku",
        "--data",
        str(csv_path),
        "--tier",
        "any",
        "--out",
        str(target),
        "--json",
    )
    assert code == 0 and json.loads(out)["train"]["rows"] + json.loads(out)["test"]["rows"] == 4
