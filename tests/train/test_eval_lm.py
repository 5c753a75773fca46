"""Held-out evaluation by depth (latentloop.eval.lm): exact match by teacher forcing, perplexity, reports."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from latentloop.errors import UsageError
from latentloop.eval.lm import evaluate_lm
from latentloop.eval.metrics import heldout_metric
from latentloop.tasks.arithmetic import ArithmeticTask
from latentloop.tasks.text import TextTask
from latentloop.train.checkpoint import latest_checkpoint
from latentloop.train.loop import train


class _Oracle(nn.Module):
    """Predicts each position's label (from a lookup of the held-out rows); ``wrong`` rows get one digit off."""

    def __init__(self, task: ArithmeticTask, wrong: set[int] = frozenset(), vocab: int = 264) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.table = {}
        for index, problem in enumerate(task.test_problems()):
            inputs, labels = task.encode_example(problem)
            labels = torch.tensor(labels)
            if index in wrong:
                first = int((labels != -100).nonzero()[0])
                labels[first] = ord("9") if labels[first] != ord("9") else ord("8")
            self.table[tuple(inputs)] = labels
        self.vocab = vocab
        self.depths = []

    def forward(self, inputs, num_steps=1, init_scale=1.0):
        self.depths.append((num_steps, init_scale))
        labels = torch.stack([self.table[tuple(row.tolist())] for row in inputs])
        logits = torch.nn.functional.one_hot(labels.clamp(min=0), self.vocab).float() * 10
        return SimpleNamespace(logits=logits)


def test_exact_match_counts_problems_whose_every_answer_token_is_right():
    task = ArithmeticTask(digits=2, test_size=40)
    assert heldout_metric(_Oracle(task), task, 4, batch_size=16) == {"exact_match": 1.0, "n": 40}
    oracle = _Oracle(task, wrong=set(range(0, 40, 4)))
    assert heldout_metric(oracle, task, 4, batch_size=16)["exact_match"] == pytest.approx(0.75)
    assert oracle.depths[0] == (4, 0.0)  # the requested depth, from a zero (deterministic) state
    assert heldout_metric(_Oracle(task), task, 1, limit=10)["n"] == 10


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    task = TextTask(seq_len=32)

    class Uniform(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(1))

        def forward(self, inputs, num_steps=1, init_scale=1.0):
            return SimpleNamespace(logits=torch.zeros(*inputs.shape, 259))

    result = heldout_metric(Uniform(), task, 2, limit=5)
    assert result["perplexity"] == pytest.approx(259, rel=1e-4)
    assert result["tokens"] == 5 * 32 and result["loss"] == pytest.approx(math.log(259), rel=1e-5)


def test_evaluate_a_run_folder_writes_reports(tiny_config, tmp_path):
    train(tiny_config, tmp_path)
    report = evaluate_lm(tmp_path, depths=[1, 2, 4], limit=16)
    assert [r["num_steps"] for r in report["results"]] == [1, 2, 4]
    assert all(0.0 <= r["exact_match"] <= 1.0 and r["n"] == 16 for r in report["results"])
    assert report["step"] == 6 and report["metric"] == "exact_match" and report["init_scale"] == 0.0
    assert json.loads((tmp_path / "eval.json").read_text())["results"] == report["results"]
    assert "| 4 |" in (tmp_path / "eval.md").read_text()
    assert (tmp_path / "eval_depth.png").read_bytes()[:4] == b"\x89PNG"
    again = evaluate_lm(latest_checkpoint(tmp_path), depths=[1, 2, 4], limit=16, write=False)
    assert again["results"] == report["results"]  # deterministic


def test_a_bare_checkpoint_needs_a_task(tiny_config, tmp_path):
    train(tiny_config, tmp_path / "run")
    from latentloop.models.recurrent_depth import RecurrentDepthLM

    RecurrentDepthLM.from_pretrained(latest_checkpoint(tmp_path / "run")).save_pretrained(tmp_path / "bare")
    with pytest.raises(UsageError, match="--task"):
        evaluate_lm(tmp_path / "bare", depths=[1])
    report = evaluate_lm(tmp_path / "bare", depths=[1], task="arithmetic:digits=2,test_size=8")
    assert report["results"][0]["n"] == 8 and report["step"] is None
    assert (tmp_path / "bare" / "eval.md").is_file()


def test_bad_depths_are_usage_errors(tiny_config, tmp_path):
    with pytest.raises(UsageError):
        evaluate_lm(tmp_path, depths=[0])
    with pytest.raises(UsageError):
        evaluate_lm(tmp_path / "missing", depths=[1])
