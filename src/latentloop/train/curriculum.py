"""Cheaper deep supervision: a curriculum over recursion depth and weights on the supervision steps.

**Depth curriculum** (CGAR, Qasim & Zhang, arXiv 2511.08653). Early in training the model cannot use deep
recursion yet, so it trains shallow and grows: ``train.curriculum`` lists stages, each running until a
fraction ``until`` of ``train.steps`` with its own ``n_sup`` (supervision steps per batch), ``cycles`` (T,
transitions per step) and ``inner`` (low-level updates per transition); a value a stage leaves out is the
model's. After the last stage the model's own settings apply, and they are what evaluation and the saved
checkpoints use. CGAR's schedule for TRM is ``(T, n) = (2, 1)`` for the first 30% of training, ``(4, 2)`` to
60%, then ``(6, 3)``::

    train:
      curriculum:
        - {until: 0.3, cycles: 2, inner: 1}
        - {until: 0.6, cycles: 4, inner: 2}

A stage may also set GRAM's ``beta``, the weight of the KL term: a small ``beta`` early lets the posterior
carry information through the noise before the KL term prices it at the model's ``beta`` (KL annealing,
Bowman et al. 2016, "Generating Sentences from a Continuous Space", against posterior collapse). The
settings of a step are a pure function of the step, so a resumed run trains exactly what the uninterrupted
run trains.

**Supervision-step weights** (CGAR's hierarchical supervision weighting). ``train.step_weight_decay`` ``λ``
weighs the loss of supervision step ``t`` (0-based, of the sample's own steps) by ``λ^t``, normalised so
that the weights of the ``n_sup`` steps average 1 (the learning rate keeps its meaning); CGAR uses
``λ = 0.7``, which puts the weight on the early steps that make most of the progress. ``λ = 1`` weighs all
steps alike, as HRM, TRM and GRAM train.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from latentloop.errors import UsageError

DEPTH_KEYS = ("n_sup", "cycles", "inner")
STAGE_KEYS = (*DEPTH_KEYS, "beta")


@dataclass
class CurriculumStage:
    """One stage of ``train.curriculum``: the depth (and GRAM's ``beta``) of the steps before ``until`` (a
    fraction of ``train.steps``); ``None`` keeps the model's value."""

    until: float = 1.0
    n_sup: int | None = None
    cycles: int | None = None
    inner: int | None = None
    beta: float | None = None


@dataclass(frozen=True)
class Depth:
    """The recursion of one training step, and the KL weight of its loss."""

    n_sup: int
    cycles: int
    inner: int
    beta: float = 0.0


def check_curriculum(stages: list[CurriculumStage]) -> None:
    """Raise :class:`UsageError` unless every ``until`` is in (0, 1], increasing, and every depth at least 1."""
    previous = 0.0
    for index, stage in enumerate(stages):
        where = f"train.curriculum[{index}]"
        if not previous < stage.until <= 1:
            raise UsageError(
                f"{where}.until must be in ({previous:g}, 1] (a fraction of train.steps, increasing), "
                f"got {stage.until}"
            )
        previous = stage.until
        for key in DEPTH_KEYS:
            value = getattr(stage, key)
            if value is not None and value < 1:
                raise UsageError(f"{where}.{key} must be at least 1, got {value}")
        if stage.beta is not None and not stage.beta >= 0:
            raise UsageError(f"{where}.beta must not be negative, got {stage.beta}")


def depth_at(step: int, steps: int, stages: list[CurriculumStage], final: Depth) -> Depth:
    """The depth that training step ``step`` (0-based) of ``steps`` runs at: that of the first stage whose
    ``until`` it has not reached, else ``final`` (the model's)."""
    for stage in stages:
        if step < stage.until * steps:
            return Depth(
                **{
                    key: getattr(final, key) if getattr(stage, key) is None else getattr(stage, key)
                    for key in STAGE_KEYS
                }
            )
    return final


@contextmanager
def recursion(model: torch.nn.Module, depth: Depth) -> Iterator[None]:
    """Run ``model`` (a reasoner) with ``depth``'s transitions and low-level updates inside the block; its
    config is restored after, so checkpoints and evaluation keep the model's own."""
    config = model.config
    saved = config.cycles, config.inner
    config.cycles, config.inner = depth.cycles, depth.inner
    try:
        yield
    finally:
        config.cycles, config.inner = saved


def step_weights(decay: float, n_sup: int, steps: torch.Tensor) -> torch.Tensor:
    """Weights ``λ^t / mean_k λ^k`` (``k < n_sup``) of the supervision steps ``steps`` (any shape, 0-based)."""
    mean = sum(decay**k for k in range(n_sup)) / n_sup
    return decay ** steps.float() / mean
