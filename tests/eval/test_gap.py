"""GRAM's prior against its posterior on training puzzles: exact values on a hand-built model, and the
measure in a GRAM run's evaluations and in ``latentloop eval``."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from latentloop.eval.gap import gap_line, prior_posterior_gap
from latentloop.eval.reasoners import evaluate_reasoner
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.models.reasoners.base import ReasonerOutput
from latentloop.tasks.base import get_task
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_REASONER


class HandBuilt(torch.nn.Module):
    """Guided by the target it answers the target, with a KL of ``step`` nats at step ``step`` (0-based) and
    halts from step 2; unguided it answers ``prior_answers`` and never halts."""

    has_posterior = True
    arch = "hand-built"

    def __init__(self, prior_answers: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.prior_answers, self.vocab = prior_answers, vocab
        self.config = types.SimpleNamespace(n_sup=3, halting="bce", kl_reduce="sum", positions=25)

    def initial_carry(self, batch):
        return {"step": torch.zeros(len(batch["inputs"]))}

    def forward(self, carry, batch, target=None):
        step = carry["step"]
        answers = self.prior_answers if target is None else target
        logits = torch.nn.functional.one_hot(answers, self.vocab).float()
        guided = target is not None
        out = ReasonerOutput(
            logits=logits,
            halt_logit=(step - 0.5) if guided else torch.full_like(step, -1.0),
            value=torch.zeros_like(step),
            kl=step.clone() if guided else torch.zeros_like(step),
            continue_logit=torch.zeros_like(step),
        )
        return {"step": step + 1}, out


def test_the_gap_on_a_hand_built_model():
    task = get_task("nqueens", n=5)
    solutions = [task.encode(b).astype(np.int64) for b in task.solutions(np.zeros((5, 5), bool))][:4]
    inputs = np.stack([task.encode(np.zeros((5, 5), bool)).astype(np.int64)] * 4)
    labels = np.stack(solutions)
    split = {"inputs": inputs, "labels": labels, "puzzle_ids": np.arange(4)}
    prior = torch.from_numpy(labels.copy())
    prior[1:3] = torch.from_numpy(inputs[1:3])  # two empty boards: not valid answers
    gap = prior_posterior_gap(HandBuilt(prior, int(labels.max()) + 1), task, split)
    assert gap["prior_valid"] == 0.5 and gap["posterior_valid"] == 1.0 and gap["gap"] == 0.5
    assert gap["kl_per_step"] == [0.0, 1.0, 2.0] and gap["kl"] == 3.0
    assert gap["posterior_halt_steps"] == 2.0  # halt logit 0.5 > 0 first at the second step
    assert gap["prior_halt_steps"] == 3.0  # never halts: the last step
    assert (gap["puzzles"], gap["steps"]) == (4, 3)
    assert "prior 0.500, posterior 1.000" in gap_line(gap)


def test_the_gap_counts_the_kl_of_the_whole_latent_whatever_the_losss_reduction():
    """A GRAM trained with the KL averaged over positions (``kl_reduce=mean``) spends the same nats as one with
    the same weights that sums it: the gap compares runs, so it measures the whole latent's KL in both."""
    task = get_task("nqueens", n=5)
    models = []
    for reduce in ("sum", "mean"):
        config = ReasonerConfig(
            vocab_size=3, seq_len=25, dim=16, n_heads=2, hidden=32, n_sup=2, kl_reduce=reduce
        )
        models.append(build_reasoner("gram", config))
    with torch.no_grad():  # a posterior apart from its prior (they start equal)
        for parameter in models[0].parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    models[1].load_state_dict(models[0].state_dict())
    boards = [task.encode(b).astype(np.int64) for b in task.solutions(np.zeros((5, 5), bool))][:4]
    empty = task.encode(np.zeros((5, 5), bool)).astype(np.int64)
    split = {"inputs": np.stack([empty] * 4), "labels": np.stack(boards), "puzzle_ids": np.arange(4)}
    summed, averaged = (prior_posterior_gap(model, task, split) for model in models)
    assert summed["kl"] > 0
    assert averaged["kl_per_step"] == pytest.approx(summed["kl_per_step"], rel=1e-5)


def test_a_model_without_a_posterior_is_refused():
    model = HandBuilt(torch.zeros(1, 25, dtype=torch.long), 3)
    model.has_posterior = False
    with pytest.raises(ValueError, match="no posterior"):
        prior_posterior_gap(model, get_task("nqueens", n=5), {"inputs": np.zeros((1, 25)), "puzzle_ids": [0]})


def test_a_gram_run_logs_the_gap_at_each_evaluation(tmp_path):
    data = {**TINY_REASONER, "train": {**TINY_REASONER["train"], "eval_every": 2}}
    train(build_reasoner_config(data, arch="gram"), tmp_path / "gram")
    evals = [json.loads(line) for line in (tmp_path / "gram" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert len(evals) == 2
    for record in evals:
        gap = record["gap"]
        assert len(gap["kl_per_step"]) == TINY_REASONER["model"]["n_sup"]
        assert gap["kl"] == pytest.approx(sum(gap["kl_per_step"]))
        assert 0 <= gap["prior_valid"] <= 1 and gap["gap"] == gap["posterior_valid"] - gap["prior_valid"]
    report = evaluate_reasoner(tmp_path / "gram", samples=2)
    assert report["gap"]["puzzles"] > 0 and "training puzzles" in (tmp_path / "gram" / "eval.md").read_text()
    train(build_reasoner_config(data, arch="trm"), tmp_path / "trm")
    evals = [json.loads(line) for line in (tmp_path / "trm" / "metrics.jsonl").read_text().splitlines()]
    assert not any("gap" in r for r in evals)  # a deterministic model has no posterior
