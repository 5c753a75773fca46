"""Fitting GRAM's latent process reward model (LPRM) to the trained model's own samples.

The LPRM is a value head ``v(z_t)`` trained to predict the quality ``r in [0, 1]`` of the answer a trajectory
reaches, so that best-of-N picks the sample with the highest value. The value head trained with the model
(``train.value_weight``) only ever sees *posterior* trajectories, which are steered by the label and almost
always end right; at inference the samples come from the *prior*, and it does not rank them (on N-Queens 8x8 its
ROC AUC for "this sample is valid" was 0.55).

:func:`fit_value_head` fits a :class:`~latentloop.models.reasoners.heads.SequenceValueHead` to the frozen model's
prior rollouts of training puzzles instead. Every supervision step of every rollout is one example: the latent
the heads read, and as target whether the task's verifier accepts the answer that step decodes to (tasks with
puzzle embeddings (ARC) have no verifier of their own: an answer counts when it equals the label). The head's
input is detached, so the reasoner is unchanged; the head goes into the checkpoint folder as
``value_head.safetensors``, which :func:`~latentloop.models.reasoners.load_reasoner` then loads in place of the
trained one, and ``--select value`` uses it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from latentloop.errors import UsageError
from latentloop.eval.reasoners import decode_answer
from latentloop.io import atomic_path
from latentloop.models.reasoners import Reasoner
from latentloop.models.reasoners.heads import VALUE_HEAD_FILE, SequenceValueHead
from latentloop.tasks.base import Task
from latentloop.train.deep_supervision import draw_examples


@dataclass
class ValueFitResult:
    """What :func:`fit_value_head` did and how well the fitted head ranks fresh rollouts."""

    steps: int
    rollouts: int  # prior trajectories fitted on
    examples: int  # (state, verdict) pairs: one per supervision step of each rollout
    seconds: float
    loss: float  # mean BCE of the last tenth of the updates
    held_out_rollouts: int
    held_out_valid: float  # share of valid answers among the held-out states
    held_out_auc: float | None  # ROC AUC of the fitted head on them (None when one class is missing)
    current_head_auc: (
        float | None
    )  # the same for the value head the model had (trained with it, or fitted before)
    file: str


def answers_valid(task: Task, inputs: np.ndarray, answers: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``[B]`` bool: the task's verifier accepts each answer (token rows) to its puzzle.

    A task with puzzle embeddings (ARC) cannot judge a grid from the test input alone: there an answer is valid
    when it equals the label on the label's scored positions.
    """
    if getattr(task, "puzzle_embeddings", False):
        scored = labels != 0
        return ((answers == labels) | ~scored).all(-1)
    return np.array(
        [
            task.violations(task.decode(x), decode_answer(task, a)) == 0
            for x, a in zip(inputs, answers, strict=True)
        ],
        dtype=bool,
    )


@torch.no_grad()
def prior_rollouts(
    model: Reasoner,
    task: Task,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    puzzle_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model.config.n_sup`` supervision steps from the prior on ``inputs`` ``[B, L]``:
    ``(states [n_sup * B, P + L, dim], valid [n_sup * B])``, step-major."""
    device = next(model.parameters()).device
    batch = {"inputs": inputs.to(device)}
    if puzzle_ids is not None and model.config.puzzles:
        batch["puzzle_ids"] = puzzle_ids.to(device)
    noise = {"temperature": temperature} if model.stochastic else {}
    carry = model.initial_carry(batch)
    states, valid = [], []
    x, y = inputs.cpu().numpy(), labels.cpu().numpy()
    for _ in range(model.config.n_sup):
        carry, out = model(carry, batch, **noise)
        states.append(out.state.float())
        valid.append(answers_valid(task, x, out.logits.argmax(-1).cpu().numpy(), y))
    return torch.cat(states), torch.from_numpy(np.concatenate(valid))


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """The probability that a random positive scores above a random negative (ties count half)."""
    positive = positive.astype(bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks of ties
        tied = scores == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_value_head(
    model: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    held_out: int = 256,
    temperature: float = 1.0,
    augment: bool = True,
    progress: bool | None = None,
) -> tuple[SequenceValueHead, dict[str, Any]]:
    """Fit a fresh :class:`SequenceValueHead` to ``model``'s prior rollouts of ``split`` (see the module).

    Each of ``steps`` AdamW updates draws ``batch_size`` puzzles (augmented like training batches), rolls them out
    and takes one step on the BCE of all their supervision steps. ``held_out`` further rollouts, drawn from
    another seed, measure the fitted head and the model's current one. Returns the head and a summary.
    """
    if steps < 1 or batch_size < 1 or held_out < 0:
        raise UsageError("--steps and --batch-size must be at least 1 and --held-out at least 0")
    if getattr(model, "sample", None) is not None:
        raise UsageError(
            f"{model.arch} chooses among samples by its own sequence scores; it has no value head to fit"
        )
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    c = model.config
    torch.manual_seed(seed)
    head = SequenceValueHead(c.positions, c.dim, c.hidden, c.norm_eps).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    rng = np.random.default_rng([seed, 0x1F9])
    losses: list[float] = []
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=steps, desc="fitting the value head", unit="step", disable=not show, leave=False) as bar:
        for _ in range(steps):
            inputs, labels, puzzle_ids = draw_examples(task, split, rng, batch_size, augment)
            states, valid = prior_rollouts(model, task, inputs, labels, puzzle_ids, temperature)
            loss = F.binary_cross_entropy_with_logits(head.logit(states), valid.float().to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update()

    held_out_rng = np.random.default_rng([seed, 0x0DD])
    scores, trained, verdicts = [], [], []
    for start in range(0, held_out, batch_size):
        inputs, labels, puzzle_ids = draw_examples(
            task, split, held_out_rng, min(batch_size, held_out - start), augment
        )
        states, valid = prior_rollouts(model, task, inputs, labels, puzzle_ids, temperature)
        with torch.no_grad():
            scores.append(head.logit(states).cpu())
            trained.append(model.value_head(states).cpu())
        verdicts.append(valid)
    model.train(was_training)
    verdict = torch.cat(verdicts).numpy() if verdicts else np.zeros(0, dtype=bool)
    summary = ValueFitResult(
        steps=steps,
        rollouts=steps * batch_size,
        examples=steps * batch_size * c.n_sup,
        seconds=round(time.perf_counter() - started, 1),
        loss=float(np.mean(losses[-max(1, steps // 10) :])),
        held_out_rollouts=held_out,
        held_out_valid=float(verdict.mean()) if len(verdict) else 0.0,
        held_out_auc=roc_auc(torch.cat(scores).numpy(), verdict) if scores else None,
        current_head_auc=roc_auc(torch.cat(trained).numpy(), verdict) if trained else None,
        file="",
    )
    return head, asdict(summary)


def save_value_head(head: SequenceValueHead, checkpoint: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``head`` into ``checkpoint/value_head.safetensors`` (atomically), with ``summary`` as metadata."""
    path = Path(checkpoint) / VALUE_HEAD_FILE
    tensors = {key: value.detach().cpu().contiguous() for key, value in head.state_dict().items()}
    metadata = {key: str(value) for key, value in summary.items() if key != "file"}
    with atomic_path(path) as temp:
        save_file(tensors, str(temp), metadata=metadata)
    return path
