"""What a model family plugs into the training loop (:mod:`latentloop.train.loop`): an :class:`Objective`,
and the :class:`Updates` it applies its losses with."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from latentloop.tasks.base import Task
from latentloop.train import distributed as dist
from latentloop.train.optim import lr_at, set_lr


class TrainingError(RuntimeError):
    """Training cannot continue (e.g. the loss became NaN); the message names the step."""


class Updates:
    """The optimizer updates of a run: the learning rate of each (warmup, then cosine over all
    ``train.steps * per_step`` updates), gradient averaging where the objective asks for it, clipping, AdamW."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, tc: Any, per_step: int
    ) -> None:
        self.optimizer, self.tc, self.per_step = optimizer, tc, per_step
        self.params = list(model.parameters())
        self.lr = tc.lr
        self.where = "step 1"

    def begin(self, step: int, n: int = 0) -> float:
        """Set (and return) the learning rate of update ``n`` of step ``step``."""
        tc = self.tc
        total = tc.steps * self.per_step
        self.lr = lr_at(
            step * self.per_step + n, tc.lr, tc.warmup_steps, total, tc.min_lr_ratio, tc.decay_fraction
        )
        set_lr(self.optimizer, self.lr)
        self.where = f"step {step + 1}" + (f", supervision step {n + 1}" if self.per_step > 1 else "")
        return self.lr

    def check_loss(self, value: float, detail: str = "") -> None:
        """Raise :class:`TrainingError` naming the update when the loss ``value`` is not finite."""
        if not math.isfinite(value):
            raise TrainingError(f"loss became {value} at {self.where} (lr {self.lr:.3g}{detail})")

    def apply(self, loss: torch.Tensor, ctx: dist.DistContext, average: bool = False) -> float:
        """Backward, then clip and step; returns the gradient norm before clipping. ``average`` averages the
        gradients over the ranks by hand, for models that no DDP wrapper averages."""
        loss.backward()
        if average:
            dist.average_gradients(self.params, ctx)
        # Under FSDP the parameters are shards (DTensors) and this is the norm over all of them.
        clip = self.tc.grad_clip if self.tc.grad_clip > 0 else math.inf
        grad_norm = float(dist.full_value(torch.nn.utils.clip_grad_norm_(self.params, clip)))
        if not math.isfinite(grad_norm):
            raise TrainingError(f"gradient norm became {grad_norm} at {self.where}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm


class Objective(ABC):
    """What a model family trains and how. The loop builds one per run, after the process group is set up
    (its constructor checks the config against the task, before anything is written), and calls in order:
    :meth:`setup`, :meth:`build`, :meth:`resume` (when a checkpoint exists), :meth:`prepare`, then
    :meth:`train_step` each step, :meth:`train_record` at each log, :meth:`evaluate` at each evaluation and
    :meth:`saved_parts` / :meth:`checkpoint_state` at each checkpoint. ``precision`` is set by the loop
    before :meth:`prepare`. ``flops`` is the run's training compute so far: each :meth:`train_step` adds
    the forward and backward FLOPs it ran, counted from the shapes (:mod:`latentloop.nn.flops`); the loop
    logs it beside the samples seen and keeps it in checkpoints."""

    seen: str = "examples_seen"  # the counter of what the run has consumed (in checkpoints and results)
    unit: str = "ex/s"  # the progress bar's throughput unit
    updates_per_step: int = 1
    model: torch.nn.Module  # the module being trained: set by build (and prepare, where it wraps or shards)

    def __init__(self, config: Any, task: Task, out: Path, ctx: dist.DistContext, device: str) -> None:
        self.config, self.task, self.out, self.ctx, self.device = config, task, out, ctx, device
        self.tc = config.train
        self.precision = "fp32"
        self.flops = 0

    def setup(self) -> None:  # noqa: B027 - optional
        """Work that needs the run folder, before the model is built (e.g. building the dataset)."""

    def autocast(self) -> torch.autocast:
        """The autocast context of the run's precision (bf16 or none)."""
        device = "cuda" if self.device.startswith("cuda") else "cpu"
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    @abstractmethod
    def build(self, checkpoint: Path | None) -> torch.nn.Module:
        """The model to train: weights drawn now (after the run's seeding) or read from ``checkpoint``."""

    def resume(self, checkpoint: Path, log: Callable[[str], None] | None) -> None:  # noqa: B027 - optional
        """Restore what the objective keeps in ``checkpoint`` besides weights, optimizer and RNG states."""

    @abstractmethod
    def prepare(self, optimizer: torch.optim.Optimizer, checkpoint: Path | None) -> torch.optim.Optimizer:
        """Ready the model for the ranks (compile, wrap, shard, broadcast); returns the optimizer to use."""

    @abstractmethod
    def precision_probe(self) -> tuple[int, int]:
        """``(width, hidden)`` of the model's MLP, the matmul that ``train.precision=auto`` times."""

    @abstractmethod
    def train_step(self, step: int, updates: Updates) -> tuple[list[float], int]:
        """Run training step ``step``: ``(the loss of each update, what the step consumed)``, equal on every
        rank. A non-finite loss raises :class:`TrainingError` (see :meth:`Updates.check_loss`)."""

    @abstractmethod
    def train_record(self, seen: int, rate: float, lr: float) -> tuple[dict[str, Any], str]:
        """The averages since the last log (which then start afresh) and the log line; ``seen`` is the run's
        total, ``rate`` the throughput since the last log, ``lr`` the learning rate of the last update."""

    @abstractmethod
    def evaluate(self, step: int) -> tuple[dict[str, Any], str]:
        """The held-out record ``{"kind": "eval", "step": step, ...}`` (equal on every rank) and its log line."""

    @abstractmethod
    def saved_parts(self, optimizer: torch.optim.Optimizer) -> tuple[Any, torch.optim.Optimizer]:
        """``(what save_pretrained writes, the optimizer whose state is saved)``; called on every rank."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Entries the objective adds to ``trainer_state.json``."""
        return {}

    def schedule_flops(self, steps: int, done_steps: int, done_flops: int) -> float:
        """Training FLOPs of a whole schedule of ``steps`` steps, given ``done_flops`` spent on the first
        ``done_steps``: by default every step costs what the steps so far cost on average."""
        return done_flops / max(done_steps, 1) * steps

    def counts(self, seen: int) -> dict[str, int]:
        """The totals a training result reports."""
        return {self.seen: seen}
