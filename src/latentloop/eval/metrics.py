"""Judging answers: a reasoner's by the task's verifier (validity, answer identity, coverage, conflicts), an LM's by
its held-out metric.

These are pure functions of tasks, token arrays and models, shared by training (its held-out check) and
evaluation (:mod:`latentloop.eval.reasoners`), so this module imports neither of those.

Every decoded answer is judged by ``task.violations`` (0 = valid), never by comparison with one stored label,
so a valid N-Queens board that differs from the label counts. A task with puzzle embeddings (ARC) has no
verifier of its own: there an answer counts when it matches its label. Coverage (``task.multi_solution``) is
the number of distinct valid answers among the samples divided by the number of all valid completions of the
puzzle.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import UsageError
from latentloop.infer.scaling import select_sample, solve
from latentloop.models.generation import generate
from latentloop.models.reasoners.base import Reasoner
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.tasks.base import Task

EXAMPLES = 4  # answers kept in a report (and drawn): solved puzzles first


def decode_answer(task: Task, tokens: np.ndarray) -> Any:
    """The answer that predicted ``tokens`` stand for (see :meth:`Task.decode_answer`)."""
    return task.decode_answer(tokens)


def answer_key(task: Task, answer: Any) -> Hashable:
    """A hashable identity of an answer: equal answers (graph colourings up to renaming colours) share it
    (see :meth:`Task.answer_key`)."""
    return task.answer_key(answer)


def answer_exact(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the argmax answer matches every scored label (``IGNORE_LABEL`` positions are not scored)."""
    return ((logits.argmax(-1) == labels) | (labels == IGNORE_LABEL)).all(-1)


def answers_valid(
    task: Task, inputs: np.ndarray, answers: np.ndarray, labels: np.ndarray | None = None
) -> np.ndarray:
    """``[B]`` bool: the task's verifier accepts each answer (token rows) to its puzzle.

    A task with puzzle embeddings (ARC) cannot judge a grid from the test input alone: there an answer is valid
    when it equals the label on the label's scored positions.
    """
    if task.puzzle_embeddings:
        if labels is None:
            raise ValueError(f"task {task.name!r} has no verifier: give the labels")
        return ((answers == labels) | (labels == IGNORE_LABEL)).all(-1)
    return np.array(
        [
            task.violations(task.decode(x), task.decode_answer(a)) == 0
            for x, a in zip(inputs, answers, strict=True)
        ],
        dtype=bool,
    )


def unique_rows(split: dict[str, np.ndarray], limit: int | None = None) -> np.ndarray:
    """The rows of a split's distinct inputs (the first row of each puzzle id, in order), at most ``limit``."""
    _, first = np.unique(np.asarray(split["puzzle_ids"]), return_index=True)
    return np.sort(first)[:limit]


def unique_puzzles(split: dict[str, np.ndarray], limit: int | None = None) -> np.ndarray:
    """The distinct inputs of a split (see :func:`unique_rows`)."""
    return np.asarray(split["inputs"])[unique_rows(split, limit)].astype(np.int64)


def judge(task: Task, inputs: np.ndarray, predictions: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
    """``(violations [S, K, B], key ids [S, K, B], puzzles)`` for predictions ``[S, K, B, L]`` of the puzzles
    ``inputs`` ``[B, L]``: equal key ids mean equal answers (:meth:`Task.answer_key`), numbered in order of
    first appearance; ``puzzles`` are the decoded inputs."""
    steps, samples, count = predictions.shape[:3]
    violations = np.zeros((steps, samples, count), dtype=np.int64)
    key_ids = np.zeros((steps, samples, count), dtype=np.int64)
    interned: dict[Hashable, int] = {}
    puzzles = []
    for b in range(count):
        puzzle = task.decode(inputs[b])
        puzzles.append(puzzle)
        cache: dict[bytes, tuple[int, int]] = {}
        for s in range(steps):
            for k in range(samples):
                tokens = predictions[s, k, b]
                raw = tokens.tobytes()
                if raw not in cache:
                    answer = task.decode_answer(tokens)
                    key = interned.setdefault(task.answer_key(answer), len(interned))
                    cache[raw] = (int(task.violations(puzzle, answer)), key)
                violations[s, k, b], key_ids[s, k, b] = cache[raw]
    return violations, key_ids, puzzles


def chosen_samples(key_ids: np.ndarray, values: np.ndarray, mode: str) -> np.ndarray:
    """``[B]``: the sample that selection ``mode`` picks for each puzzle from ``key_ids [K, B]`` and
    ``values [K, B]`` (see :func:`~latentloop.infer.scaling.select_sample`)."""
    return np.array(
        [select_sample(key_ids[:, b].tolist(), values[:, b].tolist(), mode) for b in range(key_ids.shape[1])]
    )


def conflict_counts(violations: np.ndarray, chosen: np.ndarray) -> dict[str, Any]:
    """``{"conflicts_total", "conflicts_mean"}``: the violations of the chosen answers, with ``violations``
    ``[K, B]`` and ``chosen`` ``[B]`` (for tasks with ``reports_conflicts``)."""
    broken = violations[chosen, np.arange(violations.shape[1])]
    return {"conflicts_total": int(broken.sum()), "conflicts_mean": float(broken.mean())}


def solution_totals(task: Task, puzzles: list[Any]) -> np.ndarray:
    """``[B]``: how many valid answers each puzzle has (at least 1), the denominator of coverage."""
    return np.array([max(1, len(task.solutions(p))) for p in puzzles])


def coverage_curve(key_ids: np.ndarray, valid: np.ndarray, totals: np.ndarray) -> list[float]:
    """Mean coverage over the puzzles with the first ``k`` samples, for ``k = 1..K``: distinct valid answers
    (by ``key_ids [K, B]``, validity ``valid [K, B]``) over each puzzle's ``totals``."""
    samples, count = key_ids.shape
    curve = []
    for k in range(1, samples + 1):
        found = [len({key_ids[j, b] for j in range(k) if valid[j, b]}) for b in range(count)]
        curve.append(float(np.mean(np.array(found) / totals)))
    return curve


def example_answers(
    inputs: np.ndarray,
    predictions: np.ndarray,
    violations: np.ndarray,
    key_ids: np.ndarray,
    chosen: np.ndarray,
    totals: np.ndarray | None,
    count: int = EXAMPLES,
) -> list[dict[str, Any]]:
    """Up to ``count`` puzzles with the selected answer (tokens), solved ones first and among them those where
    the samples found the most distinct valid answers. ``predictions`` ``[K, B, L]``, ``violations`` and
    ``key_ids`` ``[K, B]``, ``chosen`` ``[B]``; ``totals`` ``[B]`` counts every valid answer (multi-solution
    tasks)."""
    idx = np.arange(len(inputs))
    broken = violations[chosen, idx]
    found = [len({key_ids[j, b] for j in range(len(key_ids)) if violations[j, b] == 0}) for b in idx]
    order = sorted(idx, key=lambda b: (broken[b] > 0, -found[b], b))[:count]
    return [
        {
            "index": int(b),
            "puzzle": inputs[b].tolist(),
            "answer": predictions[chosen[b], b].tolist(),
            "violations": int(broken[b]),
            "valid_found": found[b],
            **({"solutions": int(totals[b])} if totals is not None else {}),
        }
        for b in order
    ]


def quick_accuracy(model: Reasoner, task: Task, split: dict[str, np.ndarray], limit: int) -> dict[str, Any]:
    """One-sample accuracy at ``n_sup`` steps on the first ``limit`` test puzzles (the end-of-training check).
    A task with puzzle embeddings (ARC) has no verifier: its rows count when they match their labels."""
    device = next(model.parameters()).device
    if task.puzzle_embeddings:
        rows = slice(0, limit)
        inputs, labels = np.asarray(split["inputs"])[rows], np.asarray(split["labels"])[rows]
        puzzle_ids = torch.from_numpy(np.asarray(split["puzzle_ids"])[rows].astype(np.int64))
        result = solve(model, torch.from_numpy(inputs.astype(np.int64)).to(device), puzzle_ids=puzzle_ids)
        tokens = result.chosen.cpu().numpy()
        ok = [np.array_equal(task.decode(tokens[b]), task.decode(labels[b])) for b in range(len(inputs))]
        accuracy = float(np.mean(ok)) if ok else 0.0
        return {"num_steps": result.predictions.shape[0], "accuracy": accuracy, "exact_match": accuracy}
    inputs = unique_puzzles(split, limit)
    result = solve(model, torch.from_numpy(inputs).to(device), samples=1)
    accuracy = float(np.mean(answers_valid(task, inputs, result.chosen.cpu().numpy())))
    return {"num_steps": result.predictions.shape[0], "accuracy": accuracy, "exact_match": accuracy}


@torch.no_grad()
def heldout_metric(
    model: RecurrentDepthLM,
    task: Task,
    num_steps: int,
    batch_size: int = 256,
    limit: int | None = None,
    init_scale: float = 0.0,
    samples: int = 1,
) -> dict[str, Any]:
    """The task's held-out metric at depth ``num_steps``: ``{"exact_match", "n"}`` or
    ``{"perplexity", "loss", "tokens"}``. ``limit`` caps the number of problems (or windows). Where training
    labels the prompt's positions with intermediate results (:meth:`Task.prefix_labels_of`), exact match adds
    ``prefix_accuracy``: the share of those positions whose greedy token is their label (for permutations,
    the letters whose running product the model names at this depth).

    ``samples=K > 1`` (exact-match tasks, ``init_scale > 0``) generates every answer along K latent
    trajectories and scores their majority vote; it adds ``samples``, ``single`` (the mean accuracy of one
    trajectory) and ``any`` (the share of problems some trajectory solves)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        if task.metric == "exact_match" and samples > 1:
            return _voted_exact_match(model, task, num_steps, batch_size, limit, init_scale, samples)
        if samples != 1:
            raise UsageError(
                f"samples must be at least 1 (and above 1 only for exact-match tasks), got {samples}"
            )
        if task.metric == "exact_match":
            correct = total = prefix_right = prefix_total = 0
            for inputs, labels, problems in task.heldout_batches(batch_size, limit):
                logits = model(inputs.to(device), num_steps=num_steps, init_scale=init_scale).logits
                predicted = logits.argmax(-1).cpu()
                answer = labels != IGNORE_LABEL
                tokens_ok = ((predicted == labels) | ~answer).all(-1)
                for row, ok in enumerate(tokens_ok.tolist()):
                    # The verifier has the last word (token equality of the canonical form implies it here).
                    if ok and task.verify(problems[row], task.decode(predicted[row][answer[row]].tolist())):
                        correct += 1
                total += len(problems)
                prefixed = task.prefix_labels_of(problems, labels)
                if prefixed is not None:
                    in_prompt = (prefixed != IGNORE_LABEL) & ~answer
                    prefix_right += int((predicted == prefixed)[in_prompt].sum())
                    prefix_total += int(in_prompt.sum())
            if total == 0:
                raise UsageError("the task's held-out split is empty")
            result = {"exact_match": correct / total, "n": total}
            if prefix_total:
                result["prefix_accuracy"] = prefix_right / prefix_total
            return result
        nll, count = 0.0, 0
        for inputs, labels, _ in task.heldout_batches(batch_size, limit):
            logits = model(inputs.to(device), num_steps=num_steps, init_scale=init_scale).logits
            labels = labels.to(device)
            nll += float(
                torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_LABEL, reduction="sum"
                )
            )
            count += int((labels != IGNORE_LABEL).sum())
        if count == 0:
            raise UsageError("the task's held-out split is empty")
        return {"perplexity": math.exp(min(nll / count, 700.0)), "loss": nll / count, "tokens": count}
    finally:
        model.train(was_training)


def _voted_exact_match(
    model: RecurrentDepthLM,
    task: Task,
    num_steps: int,
    batch_size: int,
    limit: int | None,
    init_scale: float,
    samples: int,
) -> dict[str, Any]:
    """Exact match of the majority answer over ``samples`` generated trajectories per problem (left-padded
    prompts; an answer counts when it is followed by ``<eos>`` and the verifier accepts it)."""
    device = next(model.parameters()).device
    eos, pad = task.tokenizer.eos_id, task.tokenizer.pad_id
    voted = single = any_right = total = 0
    per_batch = max(1, batch_size // samples)
    for _, labels, problems in task.heldout_batches(per_batch, limit):
        prompts = [task.encode(p) for p in problems]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        new_tokens = int((labels != IGNORE_LABEL).sum(-1).max())
        out = generate(
            model,
            ids.to(device),
            max_new_tokens=new_tokens,
            num_steps=num_steps,
            init_scale=init_scale,
            attention_mask=mask.to(device),
            stop_tokens=[eos],
            pad_token_id=pad,
            num_samples=samples,
        )
        answers = out.samples[:, :, width:].cpu()
        chosen = out.sequences[:, width:].cpu()
        for row, problem in enumerate(problems):
            right = [_generated_answer_ok(task, problem, answers[row, j], eos) for j in range(samples)]
            voted += _generated_answer_ok(task, problem, chosen[row], eos)
            single += sum(right) / samples
            any_right += any(right)
        total += len(problems)
    if total == 0:
        raise UsageError("the task's held-out split is empty")
    return {
        "exact_match": voted / total,
        "n": total,
        "samples": samples,
        "single": single / total,
        "any": any_right / total,
    }


def _generated_answer_ok(task: Task, problem: Any, tokens: torch.Tensor, eos: int) -> bool:
    """A generated answer counts when it ends with ``<eos>`` and the verifier accepts the text before it."""
    ids = tokens.tolist()
    return eos in ids and task.verify(problem, task.decode(ids))


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """The probability that a random positive scores above a random negative (ties count half)."""
    positive = positive.astype(bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)  # tied scores share their mean rank
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
