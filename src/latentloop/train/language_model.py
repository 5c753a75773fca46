"""The recurrent-depth LM's training objective: one optimizer step per training step.

A step takes the step's batch (a pure function of ``(seed, step)``), the step's recurrence depth (a pure
function of ``(seed, step)``, see :mod:`latentloop.train.recurrence`) and the random initial state (drawn from
the torch RNG, which checkpoints carry), runs the forward with truncated backpropagation and applies one
update. Nothing else carries over between steps, so a resumed run reproduces the uninterrupted run exactly.

Under ``torchrun`` the step runs data-parallel (see :mod:`latentloop.train.distributed`): every rank builds
the step's global batch and keeps its slice, the initial latent state is drawn for the global batch and
sliced, and each rank's loss is weighted by its share of the global batch's scored tokens, so the averaged
gradient (and the logged loss) equals the single-process one up to float rounding. ``train.parallel`` picks
how: ``ddp`` replicates the model on every rank, ``fsdp`` shards each transformer block (prelude, recurrent
core, coda) and the rest of the model over the ranks (FSDP2) for models too large for one device;
checkpoints are the same single-file layout either way.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import UsageError
from latentloop.eval.metrics import heldout_metric
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.nn.flops import FlopCounter
from latentloop.tasks.base import Task
from latentloop.train import distributed as dist
from latentloop.train.objective import Objective, Updates
from latentloop.train.optim import build_optimizer
from latentloop.train.precision import compile_for_training
from latentloop.train.recurrence import sampler_for
from latentloop.train.run_config import RunConfig


class LanguageModelObjective(Objective):
    """Next-token loss of the recurrent-depth LM at a depth sampled per step (:class:`RunConfig` runs)."""

    seen = "tokens_seen"
    unit = "tok/s"

    def __init__(self, config: RunConfig, task: Task, out: Path, ctx: dist.DistContext, device: str) -> None:
        super().__init__(config, task, out, ctx, device)
        if not task.trains_language_model:
            raise UsageError(f"task {task.name!r} cannot train a language model")
        if self.tc.work_per_iteration is not None and not task.counts_label_work:
            raise UsageError(
                f"train.work_per_iteration: task {task.name!r} does not count the work of its labels"
            )
        _check_fit(config.model, task)
        self.sharded = ctx.enabled and self.tc.parallel == "fsdp"
        self.sampler = sampler_for(config.model, self.tc.seed)
        self.window = dict.fromkeys(("loss", "depth", "grad", "n"), 0.0)
        self._flop_costs: dict[int, tuple[int, int]] = {}

    def build(self, checkpoint: Path | None) -> torch.nn.Module:
        config = self.config.model
        model = _load_model_from(checkpoint, config) if checkpoint is not None else RecurrentDepthLM(config)
        if not self.sharded:  # FSDP moves only each rank's shard to the device
            model = model.to(self.device)
        model.train()
        if self.tc.compile:
            compile_for_training(model, self.device, self.tc.compile_threads)
        self.model = self.forward = model
        return model

    def prepare(self, optimizer: torch.optim.Optimizer, checkpoint: Path | None) -> torch.optim.Optimizer:
        if not self.sharded:
            self.forward = dist.wrap(self.model, self.ctx, self.device)
            return optimizer
        # The optimizer over the still unsharded model has read and checked the full saved state, which is
        # split into the sharded optimizer's shards here.
        full_optimizer_state = optimizer.state_dict()
        transformer = self.model.transformer
        blocks = [*transformer.prelude, *transformer.core_block, *transformer.coda]
        self.forward = self.model = dist.fully_shard_model(self.model, blocks, self.ctx, self.device)
        tc = self.tc
        optimizer = build_optimizer(self.model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
        if checkpoint is not None:
            dist.load_full_optimizer_state(self.model, optimizer, full_optimizer_state)
        return optimizer

    def precision_probe(self) -> tuple[int, int]:
        return self.config.model.n_embd, self.config.model.intermediate_size

    def train_step(self, step: int, updates: Updates) -> tuple[list[float], int]:
        tc, ctx = self.tc, self.ctx
        updates.begin(step)
        batch_inputs, batch_labels = self.task.train_batch(step, tc.batch_size, tc.seed)
        no_grad, with_grad = self.sampler(step)
        if tc.work_per_iteration is not None:
            beyond = self.task.label_work(batch_inputs) > tc.work_per_iteration * (no_grad + with_grad)
            batch_labels = batch_labels.masked_fill(beyond, IGNORE_LABEL)
        init_state = _initial_state(self.model, batch_inputs.shape, tc.init_scale, self.device)
        inputs = dist.shard(batch_inputs, ctx).to(self.device)
        labels = dist.shard(batch_labels, ctx).to(self.device)
        if init_state is not None:
            init_state = dist.shard(init_state, ctx)
        with self.autocast():
            output = self.forward(
                inputs,
                num_steps=(no_grad, with_grad),
                init_scale=tc.init_scale,
                labels=labels,
                input_states=init_state,
            )
        loss = output.loss
        if ctx.enabled:
            # The loss is a mean over scored tokens, which shards hold in different numbers: weight each shard
            # by its share, so the mean over ranks (what DDP does to gradients) is the global mean.
            scored = int((labels != IGNORE_LABEL).sum())
            share = scored / max(int((batch_labels != IGNORE_LABEL).sum()), 1)
            if scored == 0:  # keep the graph (DDP expects every rank's gradients) without a 0/0
                loss = output.logits.float().sum() * 0.0
            (loss_value,) = dist.all_reduce_sum([float(loss.detach()) * share], ctx)
            loss = loss * (share * ctx.world_size)
        else:
            loss_value = float(loss.detach())
        updates.check_loss(loss_value, f", depth {no_grad + with_grad}")
        grad_norm = updates.apply(loss, ctx)
        self.flops += self.step_flops(batch_inputs.shape, no_grad, with_grad)
        for key, value in (
            ("loss", loss_value),
            ("depth", no_grad + with_grad),
            ("grad", grad_norm),
            ("n", 1),
        ):
            self.window[key] += value
        return [loss_value], batch_inputs.numel()

    def step_flops(self, shape: torch.Size, no_grad: int, with_grad: int) -> int:
        """Training FLOPs of one step on a global batch of ``shape`` at depth ``(no_grad, with_grad)``.

        The cost is linear in the depth: prelude, coda and head once (forward and backward), a core
        iteration without gradient once its forward, one with gradient three times it. Two forwards of one
        sequence through a twin of the model (:mod:`latentloop.nn.flops`: built on the meta device, then given
        uninitialised CPU storage, so nothing is drawn and the RNG is untouched) give both terms.
        """
        batch, length = shape
        if length not in self._flop_costs:
            with torch.device("meta"):
                twin = RecurrentDepthLM(copy.deepcopy(self.config.model))
            twin.to_empty(device="cpu").eval()
            tokens = torch.zeros(1, length, dtype=torch.long)
            counts = []
            for depth in ((0, 1), (1, 1)):
                with FlopCounter(twin) as count:
                    twin(tokens, num_steps=depth, init_scale=0.0, labels=tokens)
                counts.append(count.training_flops)
            self._flop_costs[length] = (counts[0], counts[1] - counts[0])
        once, core = self._flop_costs[length]
        return batch * (once + no_grad * core + (with_grad - 1) * 3 * core)

    def train_record(self, seen: int, rate: float, lr: float) -> tuple[dict[str, Any], str]:
        window, n = self.window, self.window["n"]
        record = {
            "loss": window["loss"] / n,
            "lr": lr,
            "depth": window["depth"] / n,
            "grad_norm": window["grad"] / n,
            "tokens_seen": seen,
            "tokens_per_s": rate,
        }
        self.window = dict.fromkeys(window, 0.0)
        line = (
            f"loss {record['loss']:.4f}  lr {lr:.2e}  depth {record['depth']:.1f}"
            f"  {record['tokens_per_s']:.0f} tok/s"
        )
        return record, line

    def evaluate(self, step: int) -> tuple[dict[str, Any], str]:
        record = quick_eval(
            self.model, self.task, self.config, step, self.autocast, self.ctx, split=not self.sharded
        )
        metric = "exact_match" if "exact_match" in record else "perplexity"
        return record, f"eval step {step}: {metric} {record[metric]:.4f} at depth {record['num_steps']}"

    def saved_parts(self, optimizer: torch.optim.Optimizer) -> tuple[Any, torch.optim.Optimizer]:
        if not self.sharded:
            return self.model, optimizer
        model_state, optimizer_state = dist.gather_full_state(self.model, optimizer, self.ctx)
        if not self.ctx.is_main:
            return self.model, optimizer
        return _unsharded_copy(self.config, model_state, optimizer_state)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"task": self.config.task.name, "parallel": self.tc.parallel if self.ctx.enabled else "none"}


def _check_fit(config: RecurrentDepthConfig, task: Task) -> None:
    if config.vocab_size < task.vocab_size:
        raise UsageError(
            f"model.vocab_size {config.vocab_size} is smaller than the task's vocabulary "
            f"({task.vocab_size}); set model.vocab_size={task.vocab_size} or more"
        )
    if config.block_size < task.seq_len:
        raise UsageError(
            f"model.block_size {config.block_size} is shorter than the task's sequences ({task.seq_len})"
        )


_ARCH_FIELDS = (
    "n_embd",
    "n_heads",
    "n_layers_in_prelude",
    "n_layers_in_recurrent_block",
    "n_layers_in_coda",
    "intermediate_size",
    "vocab_size",
    "block_size",
    "tie_embeddings",
    "qk_bias",
    "bias",
)


def _load_model_from(checkpoint: Path, config: RecurrentDepthConfig) -> RecurrentDepthLM:
    try:
        model = RecurrentDepthLM.from_pretrained(checkpoint)
    except UnicodeDecodeError:  # a binary config.json (the loader reports text it cannot parse itself)
        raise UsageError(f"checkpoint {checkpoint} is corrupt: config.json is not text") from None
    for name in _ARCH_FIELDS:
        if getattr(model.config, name) != getattr(config, name):
            raise UsageError(
                f"the run folder's checkpoint {checkpoint.name} has model.{name}={getattr(model.config, name)}, "
                f"the config asks for {getattr(config, name)}; use a new --out folder to start afresh"
            )
    # Keep the training-time settings (depth sampling, checkpointing) of the current config.
    model.config = copy.deepcopy(config)
    return model


def _unsharded_copy(
    config: RunConfig, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any]
) -> tuple[RecurrentDepthLM, torch.optim.Optimizer]:
    """A plain model and optimizer holding a gathered full state, for :func:`save_checkpoint`.

    Built on the meta device and then given the gathered tensors, so no weights are drawn: the global RNG,
    which the run's next steps use, is left untouched, and no memory goes to weights that would be replaced.
    """
    with torch.device("meta"):
        model = RecurrentDepthLM(copy.deepcopy(config.model))
    model.load_state_dict(model_state, assign=True)
    if config.model.tie_embeddings:  # assignment gives the tied names separate parameters: tie them again
        model.lm_head.weight = model.transformer.wte.weight
    tc = config.train
    optimizer = build_optimizer(model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
    optimizer.load_state_dict(optimizer_state)
    return model, optimizer


def _initial_state(
    model: RecurrentDepthLM, shape: torch.Size, init_scale: float, device: str
) -> torch.Tensor | None:
    """The random initial latent state ``s_0`` for the whole global batch (as
    :meth:`RecurrentDepthLM.initialize_state` draws it), or ``None`` for zeros. Drawing it for the global batch
    on every rank, then slicing, keeps the RNG stream and each row's draw independent of the process count."""
    std = model.init_std * init_scale
    if std <= 0:
        return None
    state = torch.zeros(*shape, model.config.n_embd, device=device)
    torch.nn.init.trunc_normal_(state, std=std, a=-3 * std, b=3 * std)
    return state * model.emb_scale


class _RankBatches:
    """A task whose held-out batches are this rank's share: batch ``i`` goes to rank ``i % world_size``."""

    def __init__(self, task: Any, ctx: dist.DistContext) -> None:
        self._task, self._ctx, self.batches = task, ctx, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def heldout_batches(self, batch_size: int, limit: int | None = None) -> Any:
        for i, batch in enumerate(self._task.heldout_batches(batch_size, limit)):
            if i % self._ctx.world_size == self._ctx.rank:
                self.batches += 1
                yield batch


def quick_eval(
    model: RecurrentDepthLM,
    task: Task,
    config: RunConfig,
    step: int,
    autocast: Callable[[], Any],
    ctx: dist.DistContext = dist.SINGLE,
    split: bool = True,
) -> dict[str, Any]:
    """Held-out metric at the mean training depth on ``train.eval_size`` examples (deterministic: zero init).
    With several processes each rank evaluates its share of the batches and the counts are summed; with
    ``split=False`` (a sharded model, whose every forward is a collective that all ranks must join) every
    rank evaluates all batches."""
    split = split and ctx.enabled

    depth = config.model.mean_recurrence
    was_training = model.training
    model.eval()
    shard = _RankBatches(task, ctx) if split else task
    value: dict[str, Any] | None
    try:
        with autocast():
            value = heldout_metric(
                model, shard, depth, batch_size=config.train.eval_batch_size, limit=config.train.eval_size
            )
    except UsageError:
        if not split or shard.batches:
            raise
        value = None  # this rank's share is empty: it adds nothing to the sums below
    finally:
        model.train(was_training)
    if split:
        if task.metric == "exact_match":
            correct, total = dist.all_reduce_sum(
                [value["exact_match"] * value["n"], value["n"]] if value else [0.0, 0.0], ctx
            )
            value = {"exact_match": round(correct) / total, "n": int(total)}
        else:
            nll, count = dist.all_reduce_sum(
                [value["loss"] * value["tokens"], value["tokens"]] if value else [0.0, 0.0], ctx
            )
            loss = nll / count
            value = {"perplexity": math.exp(min(loss, 700.0)), "loss": loss, "tokens": int(count)}
    assert value is not None
    return {"kind": "eval", "step": step, "num_steps": depth, **value}
