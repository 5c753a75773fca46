"""Sudoku: parsing, the exact solver (cross-checked by brute force on 4x4), generator, augmentation, CSV."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latentloop.errors import UsageError
from latentloop.tasks import get_task
from latentloop.tasks import sudoku as S

CLASSIC = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
CLASSIC_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
# A famously hard puzzle that naked and hidden singles alone do not crack.
ESCARGOT = "1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3.."
SETTINGS = settings(max_examples=25, deadline=None)


def _all_4x4_grids() -> np.ndarray:
    """Every complete 4x4 Sudoku (288 of them), by brute force over row permutations."""
    perms = list(itertools.permutations(range(1, 5)))
    grids = []
    for rows in itertools.product(perms, repeat=4):
        grid = np.array(rows)
        if S.find_clash(grid, (2, 2)) is None:
            grids.append(grid)
    return np.array(grids, dtype=np.int8)


ALL_4x4 = _all_4x4_grids()


def test_parse_text_forms() -> None:
    expected = S.parse_grid(CLASSIC)
    assert expected[0, 0] == 5 and expected[0, 2] == 0
    assert (S.parse_grid(CLASSIC.replace(".", "0")) == expected).all()
    assert (S.parse_grid(CLASSIC.replace(".", "_")) == expected).all()
    pretty = S.format_grid(expected, pretty=True)
    assert "|" in pretty and "+" in pretty and "\n" in pretty
    assert (S.parse_grid(pretty) == expected).all()
    spaced = "\n".join(" ".join(CLASSIC[r * 9 : r * 9 + 9]) for r in range(9))
    assert (S.parse_grid(spaced) == expected).all()
    assert S.format_grid(expected) == CLASSIC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (CLASSIC[:-1], "needs 81 cells, got 80"),
        (CLASSIC + "1", "got 82"),
        (CLASSIC[:-1] + "x", "unexpected character 'x'"),
        ("55" + CLASSIC[2:], "clash"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        S.parse_grid(text)


def test_small_boxes_parse_and_solve() -> None:
    assert S.parse_grid("1...........3...", (2, 2)).shape == (4, 4)
    with pytest.raises(UsageError, match="unexpected character '5'"):
        S.parse_grid("5" + "." * 15, (2, 2))
    six = get_task("sudoku", box="2x3")
    result = six.solve(np.zeros((6, 6), np.int8), limit=1)
    assert result.count == 1 and six.verify(np.zeros((6, 6)), result.solution)


def test_solver_on_known_puzzles() -> None:
    result = S.solve(S.parse_grid(CLASSIC))
    assert result.count == 1 and result.guesses == 0  # singles suffice
    assert S.format_grid(result.solution) == CLASSIC_SOLUTION
    hard = S.solve(S.parse_grid(ESCARGOT))
    assert hard.count == 1 and hard.guesses > 5
    assert S.count_violations(S.parse_grid(ESCARGOT), hard.solution) == 0


def test_solver_counts_multiple_and_no_solutions() -> None:
    assert S.solve(np.zeros((9, 9), np.int8)).count == 2  # capped at the limit
    # Consistent givens without a solution: row 1 needs a 9 that column 9 and the box forbid.
    stuck = S.parse_grid("12345678." + "........9" + "." * 63)
    assert S.solve(stuck).count == 0
    assert S.solve(S.parse_grid("55" + CLASSIC[2:], check_givens=False)).count == 0


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), blanks=st.integers(0, 16))
def test_solver_matches_brute_force_on_4x4(seed: int, blanks: int) -> None:
    rng = np.random.default_rng(seed)
    puzzle = ALL_4x4[rng.integers(len(ALL_4x4))].copy().ravel()
    puzzle[rng.permutation(16)[:blanks]] = 0
    puzzle = puzzle.reshape(4, 4)
    matching = [g for g in ALL_4x4 if ((puzzle == 0) | (puzzle == g)).all()]
    result = S.solve(puzzle, limit=1000, keep=1000, box=(2, 2))
    assert result.count == len(matching)
    assert sorted(s.tobytes() for s in result.solutions) == sorted(g.tobytes() for g in matching)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), box=st.sampled_from([(2, 2), (2, 3), (3, 3)]))
def test_generated_puzzles_have_exactly_one_solution(seed: int, box: tuple[int, int]) -> None:
    puzzle, solution, rating = S.generate(np.random.default_rng(seed), box)
    result = S.solve(puzzle, limit=10, box=box)
    assert result.count == 1
    assert (result.solution == solution).all()
    assert result.guesses == rating
    assert S.count_violations(puzzle, solution, box) == 0


def test_generator_is_deterministic_and_respects_tiers() -> None:
    a = S.generate(np.random.default_rng(7), tier="medium")
    b = S.generate(np.random.default_rng(7), tier="medium")
    assert (a[0] == b[0]).all() and a[2] == b[2]
    assert 1 <= a[2] <= 4
    puzzle, _, rating = S.generate(np.random.default_rng(3), tier="extreme")
    assert rating >= S.TIERS["extreme"][0]
    assert S.solve(puzzle, limit=2).count == 1
    with pytest.raises(UsageError, match="no 4x4 puzzle"):
        S.generate(np.random.default_rng(0), (2, 2), tier="extreme", max_candidates=20)


def test_added_clues_keep_the_one_solution_and_rate_the_easier_puzzle() -> None:
    rng = np.random.default_rng(4)
    solution = S.random_solution(rng)
    minimal = S.minimal_puzzle(solution, rng)
    more = S.add_clues(minimal, solution, 40, rng)
    assert (more > 0).sum() == 40 and ((minimal > 0) <= (more > 0)).all()
    assert (more[more > 0] == solution[more > 0]).all()
    assert S.solve(more, limit=2).count == 1
    assert (S.add_clues(minimal, solution, 10, rng) == minimal).all()  # a minimal 9x9 has more already
    task = get_task("sudoku", n=9, tier="easy", clues=36)
    for puzzle, answer in itertools.islice(task.examples("test", seed=2), 3):
        assert (
            (puzzle > 0).sum() == 36 and S.solve(puzzle, limit=2).count == 1 and task.verify(puzzle, answer)
        )
        assert S.rate(puzzle) == 0
    with pytest.raises(UsageError, match="option clues must be at most 81"):
        get_task("sudoku", n=9, clues=82)


def test_no_added_clues_leave_the_generated_puzzles_as_they_were() -> None:
    rng = np.random.default_rng(9)
    solution = S.random_solution(rng)
    puzzle = S.minimal_puzzle(solution, rng)
    again = S.generate(np.random.default_rng(9), max_candidates=1)  # every rating: the first candidate
    assert (again[0] == puzzle).all() and (again[1] == solution).all()


def test_tier_stats_describe_the_candidates_that_fall_in_each_tier() -> None:
    box = (2, 3)
    stats = S.tier_stats(80, box=box, seed=1)
    rng = np.random.default_rng(1)  # the same candidates, made and rated here
    puzzles = [S.minimal_puzzle(S.random_solution(rng, box), rng, box) for _ in range(80)]
    ratings = np.array([S.rate(p, box) for p in puzzles])
    clues = np.array([(p > 0).sum() for p in puzzles])
    assert [s.tier for s in stats] == list(S.TIERS)
    assert sum(s.candidates for s in stats) == 80  # the tiers partition the ratings
    for s in stats:
        low, high = s.bounds
        inside = (ratings >= low) & (ratings <= (high if high is not None else ratings.max()))
        assert (s.candidates, s.share) == (inside.sum(), inside.mean())
        if inside.any():
            assert s.ratings == (ratings[inside].min(), ratings[inside].max(), np.median(ratings[inside]))
            assert s.clues == (clues[inside].min(), clues[inside].max(), pytest.approx(clues[inside].mean()))
            assert f"clues {clues[inside].min()}..{clues[inside].max()}" in s.line()
        else:
            assert s.ratings is None and "none drawn" in s.line()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), box=st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3)]))
def test_augmentation_preserves_validity(seed: int, box: tuple[int, int]) -> None:
    rng = np.random.default_rng(seed)
    solution = S.random_solution(rng, box)
    puzzle = S.minimal_puzzle(solution, rng, box)
    new_puzzle, new_solution = S.augment(puzzle, solution, rng, box)
    assert S.count_violations(new_puzzle, new_solution, box) == 0  # valid and keeps the givens
    assert (new_puzzle > 0).sum() == (puzzle > 0).sum()
    assert S.solve(new_puzzle, limit=2, box=box).count == 1


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), box=st.sampled_from([(2, 2), (2, 3), (3, 3)]))
def test_encode_decode_round_trip(seed: int, box: tuple[int, int]) -> None:
    task = get_task("sudoku", box=f"{box[0]}x{box[1]}")
    n = box[0] * box[1]
    grid = np.random.default_rng(seed).integers(0, n + 1, size=(n, n)).astype(np.int8)
    tokens = task.encode(grid)
    assert tokens.shape == (n * n,) and tokens.min() >= 1 and tokens.max() <= n + 1
    assert (task.decode(tokens) == grid).all()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), cell=st.integers(0, 80), shift=st.integers(1, 8))
def test_corrupted_answer_is_rejected(seed: int, cell: int, shift: int) -> None:
    task = get_task("sudoku", tier="easy")
    puzzle, solution, _ = S.generate(np.random.default_rng(seed), tier="easy")
    assert task.verify(puzzle, solution)
    corrupted = solution.copy().ravel()
    corrupted[cell] = (corrupted[cell] - 1 + shift) % 9 + 1
    assert not task.verify(puzzle, corrupted.reshape(9, 9))
    assert task.violations(puzzle, corrupted.reshape(9, 9)) > 0
    blanked = solution.copy().ravel()
    blanked[cell] = 0
    assert not task.verify(puzzle, blanked.reshape(9, 9))


def test_answer_that_changes_a_given_is_rejected() -> None:
    task = get_task("sudoku")
    solution = S.random_solution(np.random.default_rng(0))
    swapped = solution.copy()  # still a valid grid: digits 1 and 2 exchanged
    swapped[solution == 1], swapped[solution == 2] = 2, 1
    puzzle = np.zeros_like(solution)
    puzzle[0] = solution[0]  # the givens: the first row, holding one 1 and one 2
    assert task.violations(np.zeros_like(solution), swapped) == 0
    assert task.violations(puzzle, swapped) == 2
    assert not task.verify(puzzle, swapped)


def test_csv_loader(tmp_path) -> None:
    rng = np.random.default_rng(0)
    rows = [S.generate(rng, tier="easy") for _ in range(3)]
    path = tmp_path / "extreme.csv"
    lines = ["source,q,a,rating"] + [f"gen,{S.format_grid(p)},{S.format_grid(s)},{r}" for p, s, r in rows]
    path.write_text("\n".join(lines) + "\n")
    records = S.load_sudoku_csv(path)
    assert len(records) == 3 and (records.puzzles[1] == rows[1][0]).all() and records.ratings[2] == rows[2][2]
    assert (records.solutions[0] == rows[0][1]).all() and records.sources == ["gen"] * 3
    task = get_task("sudoku", data=str(path))  # a CSV keeps every rating by default
    pairs = list(task.examples("train")) + list(task.examples("test"))
    assert len(pairs) == 3 and all(task.verify(p, s) for p, s in pairs)

    (tmp_path / "bad_header.csv").write_text("q,a\n")
    with pytest.raises(UsageError, match="header"):
        S.load_sudoku_csv(tmp_path / "bad_header.csv")
    (tmp_path / "bad_row.csv").write_text(lines[0] + "\n" + lines[1] + "\nx,123,456,1\n")
    with pytest.raises(UsageError, match=r"bad_row\.csv:3"):
        S.load_sudoku_csv(tmp_path / "bad_row.csv")
    with pytest.raises(UsageError, match="cannot read"):
        S.load_sudoku_csv(tmp_path / "missing.csv")
    clashing = [*lines[:2], f"gen,55{lines[1].split(',')[1][2:]},{lines[1].split(',')[2]},1"]
    (tmp_path / "clash.csv").write_text("\n".join(clashing) + "\n")
    with pytest.raises(UsageError, match=r"clash\.csv:3: the givens clash"):
        S.load_sudoku_csv(tmp_path / "clash.csv")
    stray = [*lines[:2], f"gen,x{lines[1].split(',')[1][1:]},{lines[1].split(',')[2]},1"]
    (tmp_path / "stray.csv").write_text("\n".join(stray) + "\n")
    with pytest.raises(UsageError, match=r"stray\.csv:3: unexpected character 'x'"):
        S.load_sudoku_csv(tmp_path / "stray.csv")


@pytest.mark.parametrize(
    "options",
    [
        {"box": "3"},
        {"box": "4x4"},
        {"n": "5"},
        {"n": "nine"},
        {"tier": "insane"},
        {"augment": "-1"},
        {"data": "/nope.csv"},
    ],
)
def test_bad_options(options: dict[str, str]) -> None:
    with pytest.raises(UsageError):
        get_task("sudoku", **options)


def test_string_options() -> None:
    task = get_task("sudoku", n="4", augment="2", min_rating="0")
    assert task.box == (2, 2) and task.augmented_copies == 2 and task.vocab_size == 6


def test_unconditional_rows_map_the_empty_grid_to_random_complete_boards() -> None:
    task = get_task("sudoku", n=6, unconditional="true")
    rows = list(task.records("train", 0, 20))
    blank = task.encode(task.blank())
    assert all(np.array_equal(inputs, blank) for inputs, *_ in rows)
    boards = [task.decode(labels) for _, labels, *_ in rows]
    assert all(task.verify(task.blank(), board) for board in boards)
    assert len({board.tobytes() for board in boards}) == len(boards)  # 28 million boards: no repeats
    broken = boards[0].copy()
    broken[0, 0], broken[0, 1] = broken[0, 1], broken[0, 0]  # two digits swapped in a row break two columns
    assert not task.verify(task.blank(), broken)
    with pytest.raises(UsageError, match="unconditional"):
        get_task("sudoku", n=6, unconditional="maybe")


def test_draw_colours_givens_fills_and_clashes() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    task = get_task("sudoku", box="2x2")
    solution = np.array([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]])
    puzzle = np.where(np.eye(4, dtype=bool), solution, 0)
    answer = solution.copy()
    answer[0, 1] = 1  # repeats the given 1 of row 0 (and of the top-left box)
    fig, ax = plt.subplots()
    task.draw(ax, puzzle, answer)
    colours = {(int(t.get_position()[1]), int(t.get_position()[0])): to_hex(t.get_color()) for t in ax.texts}
    plt.close(fig)
    assert len(colours) == 16
    assert colours[(0, 1)] == colours[(0, 0)] == to_hex("tab:red")  # both 1s of row 0 clash
    assert colours[(1, 1)] == "#000000" and colours[(2, 2)] == "#000000"  # untouched givens
    assert colours[(3, 0)] == to_hex("tab:blue")  # a correct fill
