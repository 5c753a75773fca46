"""Output heads shared by every reasoner: the halting Q-head and the value head (latent process reward model).

Halting comes in two variants (``model.halting``, :data:`HALTING`):

- ``bce`` (TRM/GRAM's simple ACT): ``q_halt`` is trained with BCE against "the current answer is fully
  correct"; inference halts once ``sigmoid(q_halt) > 0.5``.
- ``q-learning`` (HRM's ACT): ``q_halt`` has the same target, and ``q_continue`` is trained with BCE against a
  target bootstrapped from the next supervision step (:func:`continue_target`); inference halts once
  ``q_halt > q_continue``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.nn import SequenceMLPBlock

HALTING = ("bce", "q-learning")
VALUE_HEAD_FILE = "value_head.safetensors"  # a fitted SequenceValueHead beside a checkpoint's weights
_INITIAL_BIAS = -5.0


class HaltHead(nn.Module):
    """``(q_halt, q_continue)`` from the state of the first position (HRM/TRM/GRAM's Q-head): one logit each
    per sample.

    Both start strongly negative (bias -5, zero weights, as in HRM) so that early in training nothing halts.
    ``q_continue`` is only trained under Q-learning halting; a checkpoint saved before it existed loads with
    it at its initial values.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 1)  # q_halt (its name is the one older checkpoints hold)
        self.continue_proj = nn.Linear(dim, 1)  # q_continue
        for layer in (self.proj, self.continue_proj):
            nn.init.zeros_(layer.weight)
            nn.init.constant_(layer.bias, _INITIAL_BIAS)
        self.register_load_state_dict_pre_hook(_fill_missing_continue_head)

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = state[:, 0].float()
        # One product for both outputs, as one two-output layer computes them (the official HRM/TRM Q-head).
        weight = torch.cat([self.proj.weight, self.continue_proj.weight]).float()
        bias = torch.cat([self.proj.bias, self.continue_proj.bias]).float()
        q_halt, q_continue = F.linear(first, weight, bias).unbind(-1)
        return q_halt, q_continue


def _fill_missing_continue_head(module: HaltHead, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    # Weights written before the head had a q_continue output: keep its initial values, so loading stays
    # strict about every other key.
    for name in ("weight", "bias"):
        key = f"{prefix}continue_proj.{name}"
        if key not in state_dict and f"{prefix}proj.{name}" in state_dict:
            state_dict[key] = getattr(module.continue_proj, name).detach().clone()


def halt_decision(q_halt: torch.Tensor, q_continue: torch.Tensor, halting: str) -> torch.Tensor:
    """``[B]`` bool: where the Q-head halts during training, ``q_halt > q_continue`` under Q-learning halting
    and ``q_halt > 0`` otherwise."""
    q_halt = q_halt.float()
    return q_halt > q_continue.float() if halting == "q-learning" else q_halt > 0


def continue_target(
    q_halt_next: torch.Tensor, q_continue_next: torch.Tensor, last: bool | torch.Tensor
) -> torch.Tensor:
    """HRM's bootstrapped target for ``q_continue`` of a supervision step, from the Q logits of the *next*
    step (run without gradient from this step's carry).

    Continuing is worth what the best action of the next step is worth, ``sigmoid(max(q_halt', q_continue'))``.
    At the last supervision step (``last``) continuing runs past ``n_sup``, where the model has to halt, so the
    target is ``sigmoid(q_halt')``. ``last`` may be a ``[B]`` bool tensor when samples are at different steps.
    """
    q_halt_next, q_continue_next = q_halt_next.float(), q_continue_next.float()
    last = torch.as_tensor(last, device=q_halt_next.device)
    best = torch.where(last, q_halt_next, torch.maximum(q_halt_next, q_continue_next))
    return torch.sigmoid(best)


class ValueHead(nn.Module):
    """``v(z) in (0, 1)``: the predicted accuracy of the answer the latent ``z`` decodes to (GRAM's LPRM).

    Reads the mean state over positions: the answer's quality is a property of the whole grid.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.proj(state.float().mean(dim=1)).squeeze(-1))


class SequenceValueHead(nn.Module):
    """A value head that mixes the latent along the sequence before pooling: one :class:`SequenceMLPBlock`
    over the ``positions`` states, then the mean state and a linear map to ``v(z) in (0, 1)``.

    Whether an N-Queens board or a colouring is valid depends on pairs of positions, which the mean state
    hides from a linear head; the block lets each position see every other first. It is the head that
    :func:`latentloop.train.value.fit_value_head` fits to a trained model's own samples.
    """

    def __init__(self, positions: int, dim: int, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.block = SequenceMLPBlock(positions, dim, hidden, eps)
        self.proj = nn.Linear(dim, 1)

    def logit(self, state: torch.Tensor) -> torch.Tensor:
        """``[B]`` logits of the value (the loss of fitting is computed on these, for stability)."""
        return self.proj(self.block(state.float()).mean(dim=1)).squeeze(-1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logit(state))
