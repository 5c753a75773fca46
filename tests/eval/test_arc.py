"""ARC evaluation: copies grouped per test input, answers mapped back through their augmentation, pass@2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latentloop.eval import arc as arc_eval
from latentloop.eval.arc import copies_by_test_input, evaluate_arc, ranked_answers
from latentloop.infer.scaling import SolveResult
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.tasks.arc import ArcTransform, encode_grid
from latentloop.tasks.base import get_task

SOLUTION = np.array([[1, 2, 0], [3, 3, 4]], dtype=np.int8)
QUESTION = np.array([[5, 0], [0, 5]], dtype=np.int8)
TRANSFORMS = [
    ArcTransform(),
    ArcTransform(k=1, colors=(0, 2, 3, 4, 5, 6, 7, 8, 9, 1), offset=(2, 1)),
    ArcTransform(k=5, colors=(0, 9, 8, 7, 6, 5, 4, 3, 2, 1), offset=(0, 3)),
    ArcTransform(k=2, colors=(0, 3, 1, 2, 4, 5, 6, 7, 8, 9), offset=(4, 4)),
]


def split_of(transforms: list[ArcTransform]) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """One test input under each transform (one puzzle id per copy), as a dataset's test split."""
    inputs = np.stack([encode_grid(t.apply(QUESTION), t.offset) for t in transforms])
    labels = np.stack([encode_grid(t.apply(SOLUTION), t.offset) for t in transforms])
    ids = np.arange(10, 10 + len(transforms))
    puzzles = {
        str(p): {"task": "abc", "transform": t.to_json()} for p, t in zip(ids, transforms, strict=True)
    }
    return {"inputs": inputs, "labels": labels, "puzzle_ids": ids}, puzzles


def fake_solve(answers: np.ndarray):
    """A ``solve`` that returns ``answers`` ``[rows, L]`` (tokens in each copy's own frame) for every step."""

    def solve(model, x, steps=None, samples=1, puzzle_ids=None, **_):
        rows = [int(p) - 10 for p in puzzle_ids]
        tokens = torch.from_numpy(answers[rows].astype(np.int64))
        predictions = tokens[None, None].expand(2, samples, -1, -1)
        values = torch.zeros(2, samples, len(rows))
        empty = torch.zeros(samples, len(rows))
        return SolveResult(predictions, values, values, empty.long(), torch.zeros(len(rows)).long(), tokens)

    return solve


@pytest.fixture
def model():
    task = get_task("arc-agi-1")
    config = ReasonerConfig(
        vocab_size=task.vocab_size, seq_len=task.seq_len, dim=8, n_heads=2, n_layers=1, hidden=8
    )
    return build_reasoner("trm", config), task


def test_answers_are_mapped_back_before_the_vote(monkeypatch, model):
    model, task = model
    split, puzzles = split_of(TRANSFORMS)
    # The identity copy answers wrongly; the three augmented copies answer right in their own frames, so
    # only an evaluation that undoes each augmentation sees three equal answers.
    answers = split["labels"].copy()
    answers[0] = encode_grid(np.full((2, 3), 7))
    monkeypatch.setattr(arc_eval, "solve", fake_solve(answers))
    report = evaluate_arc(model, task, split, puzzles)
    assert report["puzzles"] == 1 and report["copies"] == 4
    assert report["accuracy"] == 1.0 and report["accuracy_by_select"]["vote"] == 1.0
    assert report["accuracy_by_select"]["first"] == 0.0  # pass@1 of the identity copy alone
    assert report["oracle_accuracy"] == 1.0


def test_wrong_answers_score_nothing(monkeypatch, model):
    model, task = model
    split, puzzles = split_of(TRANSFORMS)
    # Every copy answers the solution turned by 180 degrees, in its own frame.
    wrong = np.stack([encode_grid(np.rot90(SOLUTION, 2).copy(), t.offset) for t in TRANSFORMS])
    monkeypatch.setattr(arc_eval, "solve", fake_solve(wrong))
    report = evaluate_arc(model, task, split, puzzles)
    assert report["accuracy"] == 0.0 and report["oracle_accuracy"] == 0.0


def test_copies_are_grouped_per_test_input_with_the_identity_first():
    split, puzzles = split_of(TRANSFORMS[::-1])
    (group,) = copies_by_test_input(split, puzzles)
    assert group[0][1] == ArcTransform() and len(group) == 4


def test_ranking_by_votes_values_and_first():
    keys, values = [3, 1, 1, 2, 2, 2], [0.1, 0.9, 0.2, 0.3, 0.3, 0.4]
    assert ranked_answers(keys, values, "vote") == [2, 1]
    assert ranked_answers(keys, values, "value") == [1, 2]
    assert ranked_answers(keys, values, "first") == [3]
