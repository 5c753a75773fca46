"""ARC evaluation of a reasoner with puzzle embeddings (HRM/TRM protocol).

The test split holds every augmented copy of each evaluation task's test inputs, each copy under its own
puzzle id. Every copy is solved (``samples`` trajectories each), each answer is decoded and mapped back
through its copy's inverse augmentation, and the two highest-ranked answers of a test input are scored
(pass@2). Ranking: ``vote`` counts equal answers over copies and samples, ``value`` takes the value head's
best score per answer, ``first`` is the identity copy's first sample alone (pass@1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from latentloop.errors import UsageError
from latentloop.infer.scaling import SELECTIONS, solve
from latentloop.models.reasoners import Reasoner, num_parameters
from latentloop.tasks.arc import ArcPuzzle, ArcTransform, decode_grid, encode_grid, format_arc_grid
from latentloop.tasks.base import Task


def ranked_answers(keys: Sequence[int], values: Sequence[float], mode: str, top: int = 2) -> list[int]:
    """The ``top`` best answer keys: most votes (``vote``; ties: first seen), highest of ``values`` (``value``:
    the value head's; ``q``: the halting logits), or the first answer alone (``first``)."""
    if mode == "first":
        return list(keys[:1])
    if mode == "vote":
        return [key for key, _ in Counter(keys).most_common(top)]
    best: dict[int, float] = {}
    for key, value in zip(keys, values, strict=True):
        best[key] = max(best.get(key, -np.inf), value)
    return sorted(best, key=lambda key: -best[key])[:top]


def copies_by_test_input(
    split: dict[str, np.ndarray], puzzles: dict[str, Any]
) -> list[list[tuple[int, ArcTransform]]]:
    """Rows of the test split grouped by the test input they are copies of: ``[(row, transform), ...]`` per
    test input, the identity copy first. A copy's rows are its task's test inputs in order."""
    groups: dict[tuple[str, int], list[tuple[int, ArcTransform]]] = {}
    seen: Counter[int] = Counter()
    for row, pid in enumerate(np.asarray(split["puzzle_ids"]).tolist()):
        info = puzzles.get(str(pid))
        if info is None or "task" not in info:
            raise UsageError(f"puzzle id {pid} of the ARC dataset has no task and augmentation recorded")
        index = seen[pid]
        seen[pid] += 1
        groups.setdefault((info["task"], index), []).append((row, ArcTransform.from_json(info["transform"])))
    for members in groups.values():
        members.sort(key=lambda member: member[1] != ArcTransform())
    return list(groups.values())


@torch.no_grad()
def evaluate_arc(
    model: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    puzzles: dict[str, Any],
    samples: int = 1,
    steps: int | None = None,
    select: str = "vote",
    batch_size: int = 64,
    limit: int | None = None,
) -> dict[str, Any]:
    """pass@2 of ``model`` on the ARC ``task``'s test split (``puzzles``: the dataset's per-puzzle-id info), with curves
    over steps (``select``) and samples; the report has the shape of
    :func:`latentloop.eval.reasoners.evaluate_model`'s, its accuracies being pass@2 (``first``: pass@1)."""
    if select not in SELECTIONS:
        raise UsageError(f"--select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    groups = copies_by_test_input(split, puzzles)[:limit]
    rows = np.array([row for members in groups for row, _ in members], dtype=np.int64)
    transforms = {row: transform for members in groups for row, transform in members}
    inputs = torch.from_numpy(np.asarray(split["inputs"])[rows].astype(np.int64))
    puzzle_ids = torch.from_numpy(np.asarray(split["puzzle_ids"])[rows].astype(np.int64))
    device = next(model.parameters()).device
    per_chunk = max(1, batch_size // samples)
    preds, vals, halts = [], [], []
    for start in range(0, len(rows), per_chunk):
        chunk = slice(start, start + per_chunk)
        result = solve(
            model, inputs[chunk].to(device), steps=steps, samples=samples, puzzle_ids=puzzle_ids[chunk]
        )
        preds.append(result.predictions.cpu().numpy().astype(np.uint8))
        vals.append(result.values.float().cpu().numpy())
        logits = result.halt_logits if result.halt_logits is not None else result.halt_prob
        halts.append(logits.float().cpu().numpy())
    predictions, values = np.concatenate(preds, axis=2), np.concatenate(vals, axis=2)  # [S, K, R(, L)]
    halt_logits = np.concatenate(halts, axis=2)
    n_steps = predictions.shape[0]
    position = {int(row): i for i, row in enumerate(rows)}

    # Every answer (and solution) in the original frame, interned: equal grids share a key.
    interned: dict[tuple[tuple[int, ...], bytes], int] = {}

    def intern(grid: np.ndarray) -> int:
        grid = np.ascontiguousarray(grid)
        return interned.setdefault((grid.shape, grid.tobytes()), len(interned))

    labels = np.asarray(split["labels"])
    solutions = [intern(members[0][1].invert(decode_grid(labels[members[0][0]]))) for members in groups]
    keys = np.zeros(predictions.shape[:3], dtype=np.int64)
    for i, row in enumerate(rows.tolist()):
        cache: dict[bytes, int] = {}
        for s in range(n_steps):
            for k in range(samples):
                raw = predictions[s, k, i].tobytes()
                if raw not in cache:
                    cache[raw] = intern(transforms[row].invert(decode_grid(predictions[s, k, i])))
                keys[s, k, i] = cache[raw]

    def pass_at_2(s: int, k: int, mode: str) -> float:
        solved = 0
        for members, solution in zip(groups, solutions, strict=True):
            cols = [position[row] for row, _ in members]
            group_keys = keys[s, :k][:, cols].T.reshape(-1).tolist()  # copy-major: the identity copy first
            scores = halt_logits if mode == "q" else values
            group_values = scores[s, :k][:, cols].T.reshape(-1).tolist()
            solved += solution in ranked_answers(group_keys, group_values, mode)
        return solved / max(len(groups), 1)

    last = n_steps - 1
    return {
        "task": task.name,
        "metric": "pass@2",
        "parameters": num_parameters(model),
        "puzzles": len(groups),
        "copies": len(rows),
        "samples": samples,
        "steps": n_steps,
        "select": select,
        "accuracy": pass_at_2(last, samples, select),
        "accuracy_by_select": {mode: pass_at_2(last, samples, mode) for mode in SELECTIONS},
        "oracle_accuracy": float(
            np.mean(
                [
                    solution in keys[last][:, [position[row] for row, _ in members]]
                    for members, solution in zip(groups, solutions, strict=True)
                ]
            )
        )
        if groups
        else 0.0,
        "curve_steps": [{"steps": s + 1, "accuracy": pass_at_2(s, samples, select)} for s in range(n_steps)],
        "curve_samples": [
            {"samples": k, **{mode: pass_at_2(last, k, mode) for mode in ("vote", "value")}}
            for k in range(1, samples + 1)
        ],
    }


@torch.no_grad()
def solve_arc_puzzle(
    model: Reasoner,
    task: Task,
    puzzle: ArcPuzzle,
    puzzles: dict[str, Any],
    samples: int = 1,
    select: str = "vote",
) -> tuple[dict[str, Any], str, bool]:
    """``latentloop solve arc-agi-1 TASK_ID --model RUN``: solve every augmented copy of the test input the
    model has a puzzle embedding for, map the answers back, rank them (``select``), and report the two best
    (``payload, text, solved``; solved means pass@2 when the answer is known, else that an answer came out)."""
    if select not in SELECTIONS:
        raise UsageError(f"--select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    copies = sorted(
        (
            ArcTransform.from_json(info["transform"]) != ArcTransform(),
            int(pid),
            ArcTransform.from_json(info["transform"]),
        )
        for pid, info in puzzles.items()
        if info.get("task") == puzzle.task_id
    )
    if not copies:
        raise UsageError(
            f"the model has no puzzle embedding for ARC task {puzzle.task_id}: it answers only the tasks "
            "whose demonstrations it was trained on"
        )
    inputs = np.stack([encode_grid(t.apply(puzzle.test_input), t.offset) for _, _, t in copies]).astype(
        np.int64
    )
    device = next(model.parameters()).device
    result = solve(
        model,
        torch.from_numpy(inputs).to(device),
        samples=samples,
        puzzle_ids=torch.tensor([pid for _, pid, _ in copies]),
    )
    grids: list[np.ndarray] = []
    index: dict[tuple[tuple[int, ...], bytes], int] = {}
    keys, values = [], []
    for c, (_, _, transform) in enumerate(copies):  # copy-major: the identity copy first
        for k in range(samples):
            grid = np.ascontiguousarray(
                transform.invert(decode_grid(result.predictions[-1, k, c].cpu().numpy()))
            )
            key = index.setdefault((grid.shape, grid.tobytes()), len(grids))
            if key == len(grids):
                grids.append(grid)
            keys.append(key)
            values.append(float(result.values[-1, k, c]))
    answers = [grids[key] for key in ranked_answers(keys, values, select)]
    payload: dict[str, Any] = {
        "task": puzzle.task_id,
        "answers": [format_arc_grid(a) for a in answers],
        "copies": len(copies),
        "samples": samples,
    }
    lines = [f"answer {i + 1}: {format_arc_grid(a)}" for i, a in enumerate(answers)]
    solved = bool(answers)
    if puzzle.solution is not None:
        solved = any(a.shape == puzzle.solution.shape and (a == puzzle.solution).all() for a in answers)
        payload["pass_at_2"] = solved
        lines.append("solved (pass@2)" if solved else "not solved (pass@2)")
    return payload, "\n".join(lines), solved
