"""Fitting the value head (LPRM) to a model's own samples: verifier targets, the fitting loop, the saved head."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import latentloop.train.value as value_module
from latentloop.cli import main
from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import UsageError
from latentloop.eval.metrics import roc_auc
from latentloop.eval.reasoners import answers_valid
from latentloop.infer.runs import load_run
from latentloop.models.reasoners.heads import VALUE_HEAD_FILE, SequenceValueHead
from latentloop.tasks.base import get_task
from latentloop.tasks.nqueens import all_solutions, board_from_columns
from latentloop.train.checkpoint import latest_checkpoint
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config
from latentloop.train.value import fit_value_head
from tests.tiny import TINY_REASONER, tiny_run


def test_the_verifier_accepts_a_valid_answer_that_differs_from_the_label():
    task = get_task("nqueens", n=5)
    first, second = (task.encode(board_from_columns(columns)) for columns in all_solutions(5)[:2])
    empty = np.full_like(first, 1)  # no queen given: every solution completes it
    broken = first.copy()
    broken[:2] = 2  # two queens on the first row
    answers = np.stack([first, second, broken])
    valid = answers_valid(task, np.stack([empty] * 3), answers, np.stack([first] * 3))
    assert valid.tolist() == [True, True, False]


def test_without_a_verifier_an_answer_is_valid_when_it_matches_the_scored_labels():
    class Arc:
        puzzle_embeddings = True

    labels = np.array([[3, 4, IGNORE_LABEL, IGNORE_LABEL], [3, 4, IGNORE_LABEL, IGNORE_LABEL]])
    answers = np.array([[3, 4, 7, 7], [3, 5, 0, 0]])  # unscored positions differ / a scored one does
    assert answers_valid(Arc(), np.zeros_like(labels), answers, labels).tolist() == [True, False]


def test_roc_auc_ranks_positives_above_negatives_and_counts_ties_half():
    positive = np.array([0, 0, 1, 1])
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), positive) == 1.0
    assert roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), positive) == 0.0
    assert roc_auc(np.full(4, 0.5), positive) == 0.5
    assert roc_auc(np.array([0.1, 0.6, 0.6, 0.9]), positive) == pytest.approx(0.875)
    assert roc_auc(np.array([0.1, 0.2]), np.array([1, 1])) is None


@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=2, max_size=40))
def test_roc_auc_equals_the_share_of_positive_negative_pairs_ranked_right(pairs):
    scores = np.array([float(score) for score, _ in pairs])
    positive = np.array([label for _, label in pairs])
    if positive.all() or not positive.any():
        assert roc_auc(scores, positive) is None
        return
    above = scores[positive][:, None] - scores[~positive][None, :]
    expected = ((above > 0).sum() + 0.5 * (above == 0).sum()) / above.size
    assert roc_auc(scores, positive) == pytest.approx(expected)


def test_the_fitting_loop_learns_a_verdict_that_depends_on_pairs_of_positions(gram_run, monkeypatch):
    # Replace the rollouts with states whose verdict is "positions 0 and 1 agree in sign on dim 0": invisible
    # to the mean state, learnable by a head that mixes positions first.
    model, task, _, folder = load_run(gram_run)
    generator = torch.Generator().manual_seed(0)

    def synthetic_rollouts(model, task, inputs, labels, puzzle_ids=None, temperature=1.0):
        shape = (model.config.n_sup * len(inputs), model.config.positions, model.config.dim)
        states = torch.randn(*shape, generator=generator)
        return states, states[:, 0, 0] * states[:, 1, 0] > 0

    monkeypatch.setattr(value_module, "prior_rollouts", synthetic_rollouts)
    split = {key: np.asarray(value) for key, value in _train_split(folder).items()}
    _, summary = fit_value_head(model, task, split, rollouts=2048, steps=300, batch_size=64, lr=3e-3)
    assert summary["held_out_auc"] > 0.9
    assert 0.4 < summary["held_out_valid"] < 0.6
    assert summary["examples"] == 2048 * model.config.n_sup


def _train_split(folder):
    from latentloop.data.dataset import load_dataset

    return load_dataset(folder / "data").split("train")


def test_fit_value_writes_a_head_that_loading_and_value_selection_then_use(gram_run, capsys):
    args = ["--rollouts", "8", "--steps", "2", "--batch-size", "4", "--held-out", "8", "--json"]
    code = main(["fit-value", str(gram_run), *args])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    checkpoint = latest_checkpoint(gram_run)
    assert summary["file"] == str(checkpoint / VALUE_HEAD_FILE) and summary["rollouts"] == 8
    assert not [p for p in checkpoint.iterdir() if p.name.endswith(".tmp")]

    model, _, _, _ = load_run(gram_run)
    assert isinstance(model.value_head, SequenceValueHead)
    batch = {"inputs": torch.ones(3, model.config.seq_len, dtype=torch.long)}
    with torch.no_grad():
        _, out = model(model.initial_carry(batch), batch)
        assert torch.equal(out.value, model.value_head(out.state))

    # Training resumes from the raw weights: the fitted head does not leak into the trained model.
    (checkpoint / VALUE_HEAD_FILE).unlink()
    model, _, _, _ = load_run(gram_run)
    assert not isinstance(model.value_head, SequenceValueHead)


def test_a_damaged_fitted_head_is_one_error_line(gram_run, capsys):
    checkpoint = latest_checkpoint(gram_run)
    (checkpoint / VALUE_HEAD_FILE).write_bytes(b"not safetensors")
    try:
        assert main(["eval", str(gram_run), "--samples", "1", "--limit", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "value_head.safetensors" in err and len(err.splitlines()) == 1
    finally:
        (checkpoint / VALUE_HEAD_FILE).unlink()


def test_fit_value_refuses_deterministic_models_and_folders_without_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "trm"
    data = tiny_run(
        TINY_REASONER,
        arch="trm",
        model={"n_sup": 1, "cycles": 1, "inner": 1},
        train={"batch_size": 4, "steps": 1, "eval_size": 0},
    )
    train(build_reasoner_config(data), run)
    assert main(["fit-value", str(run), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "trm" in err and len(err.splitlines()) == 1
    assert not (latest_checkpoint(run) / VALUE_HEAD_FILE).exists()
    assert main(["fit-value", str(tmp_path / "nowhere")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_rollouts_beyond_the_memory_limit_are_fitted_in_rounds(gram_run, monkeypatch):
    model, task, _, folder = load_run(gram_run)
    generator = torch.Generator().manual_seed(0)
    pools = []

    def synthetic_rollouts(model, task, inputs, labels, puzzle_ids=None, temperature=1.0):
        shape = (model.config.n_sup * len(inputs), model.config.positions, model.config.dim)
        states = torch.randn(*shape, generator=generator)
        pools.append(len(inputs))
        return states, states[:, 0, 0] * states[:, 1, 0] > 0

    monkeypatch.setattr(value_module, "prior_rollouts", synthetic_rollouts)
    c = model.config
    per_rollout = c.n_sup * c.positions * c.dim * 2
    limit = 600 * per_rollout / 2**30  # 600 rollouts at a time
    split = {key: np.asarray(value) for key, value in _train_split(folder).items()}
    _, summary = fit_value_head(
        model,
        task,
        split,
        rollouts=2048,
        steps=300,
        batch_size=64,
        lr=3e-3,
        held_out=256,
        max_memory_gib=limit,
    )
    assert summary["rounds"] == 4 and max(pools) <= 600 and sum(pools) == 2048 + 256
    assert summary["held_out_auc"] > 0.9, "the head keeps learning across rounds"


def test_a_rollout_larger_than_the_memory_limit_is_refused_before_rolling_out(gram_run, capsys):
    model, task, _, folder = load_run(gram_run)
    with pytest.raises(UsageError, match="MiB of latents"):
        fit_value_head(model, task, _train_split(folder), max_memory_gib=1e-9)
    assert main(["fit-value", str(gram_run), "--memory-gib", "0"]) == 2
    assert "--memory-gib must be a positive number" in capsys.readouterr().err
