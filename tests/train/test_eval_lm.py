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
from latentloop.eval.metrics import _generated_answer_ok, heldout_metric
from latentloop.tasks import get_task
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


def test_width_scores_the_majority_answer_and_reports_one_and_any_trajectory(monkeypatch):
    """Three problems, three trajectories each, answers built by hand: the vote is right on the first two
    (2 of 3 agree; all differ and the first is right), wrong on the third (2 of 3 agree on a wrong one)."""
    from latentloop.eval import metrics
    from latentloop.models.generation import GenerationOutput, vote_continuations

    task = get_task("chains", variables=4, test_size=3)
    problems = task.test_problems()
    right = [problem.value() for problem in problems]
    wrong = [(v + 1) % 10 for v in right]
    wrong2 = [(v + 2) % 10 for v in right]
    answers = [
        [right[0], right[0], wrong[0]],
        [right[1], wrong[1], wrong2[1]],
        [wrong[2], right[2], wrong[2]],
    ]
    eos = task.tokenizer.eos_id

    def fake_generate(model, ids, num_samples, **kwargs):
        assert num_samples == 3 and kwargs["init_scale"] == 1.0 and kwargs["num_steps"] == 4
        new = torch.tensor([[[ord(str(a)), eos] for a in row] for row in answers[: ids.shape[0]]])
        samples = torch.cat([ids[:, None].expand(-1, 3, -1), new], dim=-1)
        chosen, votes = vote_continuations(new)
        picked = samples[torch.arange(ids.shape[0]), chosen]
        return GenerationOutput(picked, torch.zeros(1), 0.0, samples=samples, votes=votes)

    monkeypatch.setattr(metrics, "generate", fake_generate)
    model = nn.Linear(1, 1)
    result = heldout_metric(model, task, 4, batch_size=9, init_scale=1.0, samples=3)
    assert result == {
        "exact_match": pytest.approx(2 / 3),
        "n": 3,
        "samples": 3,
        "single": pytest.approx((2 / 3 + 1 / 3 + 1 / 3) / 3),
        "any": 1.0,
    }


def test_width_without_eos_does_not_count():
    task = get_task("chains", variables=4, test_size=1)
    problem = task.test_problems()[0]
    digit = ord(str(problem.value()))
    assert metrics_ok(task, problem, [digit, task.tokenizer.eos_id])
    assert not metrics_ok(task, problem, [digit, digit])


def metrics_ok(task, problem, ids):
    return _generated_answer_ok(task, problem, torch.tensor(ids), task.tokenizer.eos_id)


def test_width_needs_a_random_initial_state(tiny_config, tmp_path):
    train(tiny_config, tmp_path)
    with pytest.raises(UsageError, match="init-scale"):
        evaluate_lm(tmp_path, depths=[2], limit=4, samples=3, write=False)
    report = evaluate_lm(tmp_path, depths=[2], limit=4, samples=3, init_scale=1.0, write=False)
    assert report["samples"] == 3 and set(report["results"][0]) == {
        "num_steps",
        "exact_match",
        "n",
        "samples",
        "single",
        "any",
    }


class _CarryTo(nn.Module):
    """Names the running product of a permutations word at its first ``reach`` letters and a wrong letter after
    them; answers the product at ``=`` only for words of at most ``reach`` letters."""

    def __init__(self, task, reach: int, vocab: int = 264) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.task, self.reach, self.vocab = task, reach, vocab

    def forward(self, inputs, num_steps=1, init_scale=0.0):
        from latentloop.tasks.permutations import LETTERS

        encode = self.task.tokenizer.encode
        targets = torch.full(inputs.shape, encode("=")[0])
        for row, ids in enumerate(inputs.tolist()):
            word = self.task.parse(self.task.decode(ids).split("=")[0])
            products = word.prefix_products()
            guesses = [p if i < self.reach else (p + 1) % 6 for i, p in enumerate(products)]
            answer = products[-1] if len(products) <= self.reach else (products[-1] + 1) % 6
            letters = "".join(LETTERS[g] for g in [*guesses, answer])
            targets[row, : len(letters)] = torch.tensor(encode(letters))
            targets[row, len(letters)] = self.task.tokenizer.eos_id
        return SimpleNamespace(logits=torch.nn.functional.one_hot(targets, self.vocab).float())


def test_prefix_accuracy_is_the_share_of_letters_whose_running_product_is_named():
    task = get_task("permutations", length="1-8", test_length="1-8", prefix_labels=True, test_size=60)
    lengths = [len(w.letters) for w in task.test_problems()]
    result = heldout_metric(_CarryTo(task, reach=3), task, 4, batch_size=16)
    assert result["exact_match"] == pytest.approx(sum(n <= 3 for n in lengths) / len(lengths))
    assert result["prefix_accuracy"] == pytest.approx(sum(min(n, 3) for n in lengths) / sum(lengths))
    assert heldout_metric(_CarryTo(task, reach=8), task, 4)["prefix_accuracy"] == 1.0
    plain = get_task("permutations", length="1-8", test_size=60)  # trained on the answer only: no such metric
    assert "prefix_accuracy" not in heldout_metric(_CarryTo(plain, reach=3), plain, 4)
