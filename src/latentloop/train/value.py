"""Fitting GRAM's latent process reward model (LPRM) to the trained model's own samples.

The LPRM is a value head ``v(z_t)`` trained to predict the quality ``r in [0, 1]`` of the answer a trajectory
reaches, so that best-of-N picks the sample with the highest value. The value head trained with the model
(``train.value_weight``) only ever sees *posterior* trajectories, which are steered by the label and almost
always end right; at inference the samples come from the *prior*, which it ranks poorly (GRAM on N-Queens 8x8:
ROC AUC 0.76 for "this sample is valid" at the last step, against 0.98 for the head fitted here).

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
from latentloop.eval.metrics import answers_valid, roc_auc
from latentloop.io import atomic_path
from latentloop.models.reasoners import Reasoner
from latentloop.models.reasoners.heads import VALUE_HEAD_FILE, SequenceValueHead
from latentloop.tasks.base import Task
from latentloop.train.puzzle_batches import draw_examples


@dataclass
class ValueFitResult:
    """What :func:`fit_value_head` did and how well the fitted head ranks fresh rollouts."""

    rollouts: int  # prior trajectories of training puzzles fitted on
    rounds: int  # pools rolled out one after the other, each within the memory limit
    examples: int  # (latent, verdict) pairs: one per supervision step of each rollout
    steps: int  # AdamW updates of the head
    seconds: float
    loss: float  # mean BCE over the last tenth of the updates
    held_out_rollouts: int
    held_out_valid: float  # share of the held-out rollouts whose last step is valid
    held_out_auc: float | None  # ROC AUC of the fitted head at the last step (None when one class is missing)
    current_head_auc: float | None  # the same for the value head the model had (trained with it, or fitted)
    file: str


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


def fit_value_head(
    model: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    rollouts: int = 12288,
    steps: int = 1000,
    batch_size: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    held_out: int = 512,
    temperature: float = 1.0,
    augment: bool = True,
    progress: bool | None = None,
    max_memory_gib: float = 8.0,
) -> tuple[SequenceValueHead, dict[str, Any]]:
    """Fit a fresh :class:`SequenceValueHead` to ``model``'s prior rollouts of ``split`` (see the module).

    Rolling out is the costly part, so each rollout is made once: ``rollouts`` training puzzles (augmented like
    training batches) are rolled out and every supervision step's latent (in bf16) and verdict kept. ``steps``
    AdamW updates then each take the BCE of ``batch_size`` of those pairs drawn at random. When the latents of
    all rollouts would take more than ``max_memory_gib`` (large grids such as ARC's), the fit runs in rounds
    that each roll out as many as fit and spend their share of the updates on them. ``held_out`` further
    rollouts, drawn with another seed, measure the fitted head and the model's current one at the last step,
    where ``--select value`` ranks. Returns the head and a summary (:class:`ValueFitResult` as a dict).
    """
    if min(rollouts, steps, batch_size) < 1 or held_out < 0:
        raise UsageError("--rollouts, --steps and --batch-size must be at least 1, --held-out at least 0")
    if not model.stochastic or model.generative:
        raise UsageError(
            f"{model.arch} has no value head to fit: value selection ranks GRAM's samples (deterministic "
            "models draw identical ones; ar and mdlm rank by their own sequence scores)"
        )
    c = model.config
    per_rollout = c.n_sup * c.positions * c.dim * 2  # bytes of bf16 latents
    capacity = int(max_memory_gib * 2**30 // per_rollout)
    if capacity < 1 or held_out > capacity:
        raise UsageError(
            f"one rollout keeps {per_rollout / 2**20:.1f} MiB of latents: {max_memory_gib:g} GiB holds {capacity} "
            f"rollouts, fewer than {'one' if capacity < 1 else f'the {held_out} of --held-out'}"
        )
    rounds = -(-rollouts // capacity)
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    show = sys.stderr.isatty() if progress is None else progress
    rng = np.random.default_rng([seed, 0x1F9])
    head: SequenceValueHead | None = None
    losses: list[float] = []
    rollouts_per_round = np.array_split(np.arange(rollouts), rounds)
    shares = zip(rollouts_per_round, np.array_split(np.arange(steps), rounds), strict=True)
    with tqdm(total=steps, desc="fitting the value head", unit="step", disable=not show, leave=False) as bar:
        for puzzles, updates in shares:
            states, verdicts = _rollout_pool(
                model, task, split, len(puzzles), rng, temperature, augment, show
            )
            if head is None:  # after the first pool: the seed draws the rollouts' noise first
                head = SequenceValueHead(c.positions, c.dim, c.hidden, c.norm_eps).to(device)
                optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
            for _ in updates:
                pick = torch.randint(0, len(states), (batch_size,))
                target = verdicts[pick].float().to(device)
                loss = F.binary_cross_entropy_with_logits(head.logit(states[pick].to(device)), target)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
                bar.update()
            del states, verdicts  # the next round's pool takes their place
    assert head is not None  # rollouts >= 1: at least one round

    fitted_auc = current_auc = None
    valid_share = 0.0
    if held_out:
        states, verdicts = _rollout_pool(
            model, task, split, held_out, np.random.default_rng([seed, 0x0DD]), temperature, augment, False
        )
        last = states.view(c.n_sup, held_out, *states.shape[1:])[-1].to(device)
        verdict = verdicts.view(c.n_sup, held_out)[-1].numpy()
        with torch.no_grad():
            fitted_auc = roc_auc(head.logit(last).float().cpu().numpy(), verdict)
            current_auc = roc_auc(model.value_head(last).float().cpu().numpy(), verdict)
        valid_share = float(verdict.mean())
    model.train(was_training)
    summary = ValueFitResult(
        rollouts=rollouts,
        rounds=rounds,
        examples=rollouts * c.n_sup,
        steps=steps,
        seconds=round(time.perf_counter() - started, 1),
        loss=float(np.mean(losses[-max(1, steps // 10) :])),
        held_out_rollouts=held_out,
        held_out_valid=valid_share,
        held_out_auc=fitted_auc,
        current_head_auc=current_auc,
        file="",
    )
    return head, asdict(summary)


def _rollout_pool(
    model: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    count: int,
    rng: np.random.Generator,
    temperature: float,
    augment: bool,
    show: bool,
    chunk: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(latents [n_sup * count, P + L, dim] bf16 on the CPU, verdicts [n_sup * count])`` of ``count`` prior
    rollouts of puzzles drawn from ``split``, step-major."""
    c = model.config
    # Filled in place, so the pool is never held twice.
    states = torch.empty(c.n_sup, count, c.positions, c.dim, dtype=torch.bfloat16)
    verdicts = torch.empty(c.n_sup, count, dtype=torch.bool)
    with tqdm(total=count, desc="rolling out", unit="rollout", disable=not show, leave=False) as bar:
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            inputs, labels, puzzle_ids = draw_examples(task, split, rng, size, augment)
            latent, valid = prior_rollouts(model, task, inputs, labels, puzzle_ids, temperature)
            states[:, start : start + size] = latent.view(c.n_sup, size, *latent.shape[1:])
            verdicts[:, start : start + size] = valid.view(c.n_sup, size)
            bar.update(size)
    return states.flatten(0, 1), verdicts.flatten()


def save_value_head(head: SequenceValueHead, checkpoint: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``head`` into ``checkpoint/value_head.safetensors`` (atomically), with ``summary`` as metadata."""
    path = Path(checkpoint) / VALUE_HEAD_FILE
    tensors = {key: value.detach().cpu().contiguous() for key, value in head.state_dict().items()}
    metadata = {key: str(value) for key, value in summary.items() if key != "file"}
    with atomic_path(path) as temp:
        save_file(tensors, str(temp), metadata=metadata)
    return path
