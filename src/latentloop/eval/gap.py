"""How much of what GRAM's posterior knows its prior has learned.

Training decodes the posterior's noise, which sees the target; inference samples the prior's. A model whose
posterior solves the training puzzles while its prior's samples do not has learned to read the target, not to
make the choices the target makes for it. :func:`prior_posterior_gap` measures both on the same training
puzzles, with the KL between them at each supervision step and the step at which the halt head stops each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from latentloop.eval.metrics import answers_valid, unique_rows
from latentloop.models.reasoners import Reasoner
from latentloop.models.reasoners.heads import halt_decision
from latentloop.tasks.base import Task

#: Training puzzles the gap is measured on: the first distinct ones of the split, the same at every evaluation.
GAP_PUZZLES = 256


@torch.no_grad()
def prior_posterior_gap(
    model: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    limit: int = GAP_PUZZLES,
    steps: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """GRAM's prior against its posterior on the first ``limit`` distinct puzzles of ``split`` (the training
    split), each run ``steps`` supervision steps (the model's ``n_sup``) from the initial carry, one sample:

    - ``prior_valid`` and ``posterior_valid``: the share of answers at the last step the task's verifier accepts
      (the prior's, as inference samples it; the posterior's, guided by the stored answer, as training runs it),
      and ``gap``, their difference;
    - ``kl_per_step``: the KL of each supervision step's last transition, nats per sample, and ``kl``, their sum
      over the steps: the nats the posterior spends on a whole trajectory, comparable across runs;
    - ``prior_halt_steps`` and ``posterior_halt_steps``: the mean step at which the halt head first halts (the
      last step when it never does).

    The model's noise is drawn from ``seed``; the caller's RNG state is kept.
    """
    if not model.has_posterior:
        raise ValueError(f"{model.arch} has no posterior to measure its prior against")
    rows = unique_rows(split, limit)
    device = next(model.parameters()).device
    inputs = np.asarray(split["inputs"])[rows].astype(np.int64)
    labels = np.asarray(split["labels"])[rows].astype(np.int64)
    batch = {"inputs": torch.from_numpy(inputs).to(device)}
    target = torch.from_numpy(labels).to(device)
    steps = steps or model.config.n_sup
    # nats of the whole latent whatever the loss's reduction: a KL averaged over positions is summed again
    per_sample = model.config.positions if model.config.kl_reduce == "mean" else 1
    was_training = model.training
    model.eval()
    result: dict[str, Any] = {"puzzles": len(rows), "steps": steps}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, guide in (("prior", None), ("posterior", target)):
            carry = model.initial_carry(batch)
            halted_at = torch.full((len(rows),), steps, device=device)
            kl = []
            for step in range(steps):
                carry, out = model(carry, batch, target=guide)
                halts = halt_decision(out.halt_logit, out.continue_logit, model.config.halting)
                halted_at = torch.where(halts & (halted_at == steps), step + 1, halted_at)
                kl.append(float(out.kl.float().mean()) * per_sample)
            answers = out.logits.argmax(-1).cpu().numpy()
            result[f"{name}_valid"] = float(np.mean(answers_valid(task, inputs, answers, labels)))
            result[f"{name}_halt_steps"] = float(halted_at.float().mean())
            if guide is not None:
                result["kl_per_step"] = kl
                result["kl"] = sum(kl)
    model.train(was_training)
    result["gap"] = result["posterior_valid"] - result["prior_valid"]
    return result


def gap_line(gap: dict[str, Any]) -> str:
    """The gap as one line of a log."""
    return (
        f"training puzzles solved: prior {gap['prior_valid']:.3f}, posterior {gap['posterior_valid']:.3f}; "
        f"KL {gap['kl']:.2f} nats per sample over {gap['steps']} steps; the prior halts after "
        f"{gap['prior_halt_steps']:.1f} steps, the posterior after {gap['posterior_halt_steps']:.1f}"
    )
