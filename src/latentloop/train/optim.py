"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: weight decay on weight matrices; none on norms, biases, ``qk_bias`` and embeddings.

    Embeddings are excluded because decaying rarely-seen rows toward zero hurts them more than it regularises
    (tied heads share the embedding matrix, so they follow). Tied parameters appear once.
    """
    decay, no_decay, seen = [], [], set()
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        is_matrix = param.dim() >= 2 and not name.endswith("qk_bias") and id(param) not in embeddings
        (decay if is_matrix else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.95),
    weight_decay: float = 0.1,
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups` of ``model``."""
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps)


def lr_at(
    step: int,
    lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
    decay_fraction: float = 1.0,
) -> float:
    """Learning rate of ``step`` (0-based): linear warmup over ``warmup_steps``, then cosine decay to
    ``min_lr_ratio * lr`` at ``total_steps`` (and flat after). A pure function of the step, so resuming needs
    no scheduler state.

    ``decay_fraction < 1`` holds the rate at ``lr`` after the warmup and decays it over only the last
    ``decay_fraction`` of the steps (warmup-stable-decay, Hu et al. 2024, MiniCPM; Hägele et al. 2024): most
    of the run learns at the full rate, and the gain of annealing comes at the end.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    start = max(warmup_steps, total_steps - round(decay_fraction * total_steps))
    span = max(total_steps - start, 1)
    progress = min(max(step - start, 0) / span, 1.0)
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate."""
    for group in optimizer.param_groups:
        group["lr"] = lr
