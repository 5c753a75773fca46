"""Solving one puzzle with a trained reasoner (``latentloop solve``): the run opened, the puzzle encoded, the
samples drawn and selected (:func:`~latentloop.infer.scaling.solve`), the answer judged by the task's verifier."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from latentloop.errors import UsageError
from latentloop.eval.arc import solve_arc_puzzle
from latentloop.infer.runs import load_run, run_dataset
from latentloop.infer.scaling import solve
from latentloop.tasks.base import Task


def solve_puzzle(
    run: str,
    task: Task,
    puzzle: Any,
    samples: int = 1,
    select: str = "vote",
    model_task: str | None = None,
    list_valid: bool = False,
    seed: int = 0,
    steps: int | None = None,
    state_noise: float = 0.0,
) -> tuple[dict, str, bool]:
    """``latentloop solve TASK PUZZLE --model RUN``: ``(payload, text, solved)``. ``model_task`` names the
    model's task when ``run`` is a bare checkpoint (a shipped pretrained model). ``seed`` seeds the model's
    sampling noise, so the same call gives the same answer (the caller's RNG state is kept). ``steps``
    (default: the model's ``n_sup``) and ``state_noise`` are :func:`~latentloop.infer.scaling.solve`'s.

    With several samples the payload also counts the distinct answers among them that the verifier accepts
    (``distinct_valid``); ``list_valid`` lists those answers as well, before the chosen one."""
    with torch.random.fork_rng(devices=[]):
        return _solve_puzzle(
            run, task, puzzle, samples, select, model_task, list_valid, seed, steps, state_noise
        )


def _solve_puzzle(
    run: str,
    task: Task,
    puzzle: Any,
    samples: int,
    select: str,
    model_task: str | None,
    list_valid: bool,
    seed: int,
    steps: int | None,
    state_noise: float,
) -> tuple[dict, str, bool]:
    model, run_task, _, folder = load_run(run, model_task)
    torch.manual_seed(seed)  # after building the model, whose (discarded) initial weights draw too
    if model.config.puzzles:
        if list_valid:
            raise UsageError("--all needs a task with a verifier; ARC answers are judged by the label")
        if run_task.name != task.name:
            raise UsageError(f"the model solves {run_task.name} puzzles, not {task.name}")
        if steps is not None or state_noise:
            raise UsageError("--steps and --state-noise take puzzles with a verifier, not ARC tasks")
        puzzles = run_dataset(run, folder).metadata.get("puzzles", {})
        return solve_arc_puzzle(model, task, puzzle, puzzles, samples, select)
    tokens = np.asarray(task.encode(puzzle), dtype=np.int64)
    if run_task.name != task.name or len(tokens) != model.config.seq_len:
        raise UsageError(
            f"the model solves {run_task.name} puzzles of {model.config.seq_len} tokens; this {task.name} puzzle "
            f"has {len(tokens)}"
        )
    result = solve(
        model,
        torch.from_numpy(tokens)[None],
        steps=steps,
        samples=samples,
        select=select,
        key=lambda t: task.answer_key(task.decode_answer(t.cpu().numpy())),
        state_noise=state_noise,
    )
    answer = task.decode_answer(result.chosen[0].numpy())
    violations = int(task.violations(puzzle, answer))
    text_answer = task.format(answer)
    payload = {"answer": text_answer, "valid": violations == 0, "violations": violations, "samples": samples}
    verdict = "valid (the verifier accepts it)" if violations == 0 else f"invalid: {violations} violations"
    drawn = task.format(answer, pretty=True)
    text = text_answer if drawn == text_answer else f"{drawn}\nanswer: {text_answer}"
    if samples == 1 and not list_valid:
        return payload, f"{text}\n{verdict}", violations == 0
    valid: dict[Hashable, str] = {}  # answer key -> its text, in sample order
    for tokens in result.predictions[-1, :, 0].cpu().numpy():
        candidate = task.decode_answer(tokens)
        if task.violations(puzzle, candidate) == 0:
            valid.setdefault(task.answer_key(candidate), task.format(candidate))
    payload["distinct_valid"] = len(valid)
    listed = ""
    if list_valid:
        payload["valid_answers"] = list(valid.values())
        listed = "".join(f"{line}\n" for line in valid.values())
    found = f"{len(valid)} distinct valid answer{'s' * (len(valid) != 1)} among {samples} samples"
    return payload, f"{listed}{found}\n{text}\n{verdict}", violations == 0
