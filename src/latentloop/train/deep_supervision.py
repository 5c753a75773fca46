"""Deep-supervision training for the puzzle reasoners (Direct, Looped, HRM, TRM, GRAM).

The objective of the puzzle reasoners in the training loop (:mod:`latentloop.train.loop`). One training *step*
takes a batch (a pure function of ``(seed, step)``, augmented on the fly where the task
allows it), starts from the model's initial carry and runs ``model.n_sup`` supervision steps. Each supervision
step is one forward (``T`` transitions, gradient only through the last), one backward and one AdamW update;
the carry is detached between them. By default the whole batch runs all ``n_sup`` steps, which keeps every
step's cost and randomness fixed. With ``train.replace_halted`` the batch is a set of slots, as in HRM and
TRM: a sample leaves its slot when the Q-head halts it (or after ``n_sup`` steps) and a fresh sample takes
its place at the next update, so the updates go to the samples that still need them (see
:class:`HaltedReplacement`). Loss of a supervision step::

    CE(logits, y) on scored positions (stable-max CE as an option), or the model's own out.loss (AR, MDLM)
    + β · KL(posterior || prior)                                  GRAM only (KL is 0 for the others)
    + halt_weight · BCE(q_halt, answer fully correct)            the simple ACT variant of TRM/GRAM
    + halt_weight · BCE(q_continue, bootstrapped target)         model.halting=q-learning only (HRM's ACT)
    + value_weight · MSE(v(z), token accuracy of this answer)    the value head (LPRM)

An EMA of the weights is kept and is what checkpoints' ``model.safetensors`` (and so ``latentloop eval``) hold;
the raw weights go beside it in ``train_model.safetensors`` for resuming. Checkpoints are written between
batches, and the model's noise is drawn from a seed of ``(seed, step, rank)``, so a resumed run reproduces
the uninterrupted run's losses exactly on the same machine.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from latentloop.data.labels import IGNORE_LABEL, STORED_IGNORE, label_tokens
from latentloop.errors import UsageError
from latentloop.eval.gap import gap_line, prior_posterior_gap
from latentloop.eval.metrics import answer_exact, answers_valid, quick_accuracy, unique_rows
from latentloop.models.reasoners import REASONERS, Reasoner, build_reasoner, num_parameters
from latentloop.models.reasoners.heads import continue_target, halt_decision
from latentloop.nn.flops import FlopCounter
from latentloop.tasks.base import Task
from latentloop.train import distributed as dist
from latentloop.train.checkpoint import resolve_checkpoint
from latentloop.train.curriculum import Depth, depth_at, recursion, step_weights
from latentloop.train.objective import Objective, Updates
from latentloop.train.precision import compile_for_training
from latentloop.train.puzzle_batches import draw_examples, fit_puzzle_embeddings, task_data, train_batch
from latentloop.train.run_config import ReasonerRunConfig, ReasonerTrainConfig, fit_to_task

TRAIN_WEIGHTS = "train_model.safetensors"
_NOISE_STREAM = 0x4E015E  # keeps model-noise seeds apart from data seeds of the same (seed, step)
_REFILL_STREAM = 0x5EF111  # the fresh samples of train.replace_halted, apart from the batches of train_batch
SLOTS_FILE = "slots.safetensors"  # train.replace_halted: the samples in flight when a checkpoint was written


class DeepSupervision(Objective):
    """Deep supervision of a reasoner (:class:`ReasonerRunConfig` runs): ``n_sup`` updates per batch, an EMA
    of the weights (what checkpoints' ``model.safetensors`` and evaluation use), halting slots under
    ``train.replace_halted``."""

    seen = "examples_seen"
    unit = "ex/s"

    def __init__(
        self, config: ReasonerRunConfig, task: Task, out: Path, ctx: dist.DistContext, device: str
    ) -> None:
        super().__init__(config, task, out, ctx, device)
        config.model = fit_to_task(config.model, task)
        # Under a curriculum a step may run fewer updates; the learning rate and the EMA follow the update
        # index of the full depth, so both stay pure functions of (step, update).
        self.updates_per_step = config.model.n_sup
        model = config.model
        self.final_depth = Depth(model.n_sup, model.cycles, model.inner, model.beta)
        self.window: dict[str, float] = {}
        self.parts: tuple[str, ...] = ()
        self._update_flops: dict[tuple[int, int], int] = {}  # by (cycles, inner)

    def setup(self) -> None:
        config, ctx = self.config, self.ctx
        prior_rows = config.model.prior_share > 0 or config.model.carry == "prior"
        if self.tc.nearest_target and not (REASONERS[config.arch].posterior_in(config.model) and prior_rows):
            raise UsageError(
                "train.nearest_target needs GRAM samples on the prior's noise (model.prior_share > 0 or "
                "model.carry=prior)"
            )
        if self.tc.nearest_target and not self.task.lists_completions:
            raise UsageError(
                f"train.nearest_target needs a task that lists every valid answer; {self.task.name!r} does not"
            )
        if ctx.is_main:  # rank 0 builds OUT/data (once) before the other ranks read it
            self.data = task_data(config, self.task, self.out)
        dist.barrier(ctx)
        if not ctx.is_main:
            self.data = task_data(config, self.task, self.out)
        fit_puzzle_embeddings(config.model, self.task, self.data)
        if config.model.puzzles and REASONERS[config.arch].generative:
            raise UsageError(
                f"{config.arch} has no puzzle embeddings; task {self.task.name} needs them (use trm, hrm or gram)"
            )

    def build(self, checkpoint: Path | None) -> torch.nn.Module:
        config = self.config
        self.model = build_reasoner(config.arch, config.model).to(self.device)
        self.ema = copy.deepcopy(self.model).requires_grad_(
            False
        )  # evaluated with eager kernels: not compiled
        if checkpoint is not None:
            _check_architecture(checkpoint, self.model)
            self.model.load_weights(checkpoint / TRAIN_WEIGHTS)
            self.ema.load_weights(checkpoint / "model.safetensors")
        elif self.tc.init_from:
            start = resolve_checkpoint(self.tc.init_from)
            _check_architecture(start, self.model)
            trained = start / TRAIN_WEIGHTS
            self.model.load_weights(trained if trained.is_file() else start / "model.safetensors")
            self.ema.load_weights(start / "model.safetensors")
        slots = HaltedReplacement if self.tc.replace_halted else FixedBatches
        self.samples = slots(self.model, self.task, self.data["train"], self.tc, self.ctx, self.device)
        self.weights = _TrainingWeights(self.model, self.ema)
        return self.model

    def resume(self, checkpoint: Path, log: Callable[[str], None] | None) -> None:
        if self.tc.replace_halted:
            _restore_slots(self.samples, checkpoint, self.ctx, log)

    def prepare(self, optimizer: torch.optim.Optimizer, checkpoint: Path | None) -> torch.optim.Optimizer:
        self.model.train()
        if self.tc.compile:
            compile_for_training(self.model, self.device, self.tc.compile_threads)
        # Ranks start equal and stay equal: the same averaged gradients give the same updates.
        dist.broadcast_module(self.model, self.ctx)
        dist.broadcast_module(self.ema, self.ctx)
        # Same order: the EMA is a deep copy.
        self.params, self.ema_params = list(self.model.parameters()), list(self.ema.parameters())
        return optimizer

    def precision_probe(self) -> tuple[int, int]:
        return self.config.model.dim, self.config.model.hidden

    def train_step(self, step: int, updates: Updates) -> tuple[list[float], int]:
        tc, ctx, model, samples = self.tc, self.ctx, self.model, self.samples
        depth = depth_at(step, tc.steps, tc.curriculum, self.final_depth)
        samples.n_sup = depth.n_sup
        update_flops = self.update_flops(depth)
        torch.manual_seed(model_noise_seed(tc.seed, step, ctx.rank))
        losses = []
        for n in range(depth.n_sup):
            batch, labels, carry, last = samples.next(step, n)
            updates.begin(step, n)
            weights = None
            if tc.step_weight_decay != 1:
                weights = step_weights(tc.step_weight_decay, depth.n_sup, samples.step_index(n))
            with self.autocast(), recursion(model, depth):
                if tc.nearest_target and self.config.model.carry == "prior":
                    # the posterior finishes the answer the prior's trajectory has begun, not the label's
                    with torch.no_grad():
                        begun = model.logits_of(carry["h"])
                    every_row = torch.ones(len(labels), dtype=torch.bool, device=labels.device)
                    labels = nearest_labels(self.task, batch["inputs"], labels, begun, every_row)
                carry, output = model(carry, batch, target=labels)
                if tc.nearest_target and "unguided" in carry:
                    labels = nearest_labels(
                        self.task, batch["inputs"], labels, output.logits, carry["unguided"]
                    )
                target_q = None
                if self.config.model.halting == "q-learning":
                    target_q = next_step_continue_target(model, carry, batch, labels, last)
                verdict = None
                if self.config.model.heads == "prior" and output.prior_logits is not None:
                    verdict = self.judge(batch["inputs"], output.prior_logits, labels)
                loss, parts = supervision_loss(
                    output, labels, depth.beta, tc, target_q, weights, self.config.model.prior_ce, verdict
                )
            value = float(loss.detach())
            if ctx.enabled:  # equal shards: the mean over ranks is the loss of the whole batch
                value, *averaged = dist.all_reduce_mean([value, *parts.values()], ctx)
                parts = dict(zip(parts, averaged, strict=True))
            updates.check_loss(value)
            # The carry holds outputs that this step's loss does not use, so DDP's hooks would wait forever;
            # gradients are averaged over ranks explicitly instead.
            grad_norm = updates.apply(loss, ctx, average=True)
            self.flops += update_flops
            with torch.no_grad():
                decay = ema_decay(tc.ema, step * self.updates_per_step + n)
                torch._foreach_lerp_(self.ema_params, self.params, 1.0 - decay)
            carry = {k: v.detach() for k, v in carry.items()}
            # The samples that finished: their answer is what inference would return.
            finished = samples.advance(carry, output, last)
            losses.append(value)
            for key, v in {"loss": value, "grad_norm": grad_norm, **parts, **finished}.items():
                self.window[key] = self.window.get(key, 0.0) + v
            self.window["n"] = self.window.get("n", 0.0) + 1
            self.parts = tuple(parts)
        (loaded,) = dist.all_reduce_sum([samples.take_loaded()], ctx)
        return losses, int(loaded)

    @torch.no_grad()
    def judge(self, inputs: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``[B]`` float: the task's verifier's verdict on each argmax answer of ``logits``."""
        valid = answers_valid(
            self.task, inputs.cpu().numpy(), logits.argmax(-1).cpu().numpy(), labels.cpu().numpy()
        )
        return torch.from_numpy(valid).to(device=logits.device, dtype=torch.float32)

    def update_flops(self, depth: Depth) -> int:
        """Training FLOPs of one supervision step of the whole batch at ``depth``: forward and backward, the
        look-ahead forward of Q-learning halting included (see :mod:`latentloop.nn.flops`). Counted once per
        depth on one training example run through the EMA model (eager, the same shapes), with the RNG
        states kept, so the count changes nothing of the training."""
        key = depth.cycles, depth.inner
        if key not in self._update_flops:
            rng = np.random.default_rng(0)
            inputs, labels, puzzle_ids = draw_examples(self.task, self.data["train"], rng, 1, False)
            batch = {"inputs": inputs.to(self.device)}
            if self.config.model.puzzles:
                batch["puzzle_ids"] = puzzle_ids.to(self.device)
            labels = labels.to(self.device)
            devices = [self.device] if self.device.startswith("cuda") else []
            with torch.random.fork_rng(devices), recursion(self.ema, depth), FlopCounter(self.ema) as count:
                carry, _ = self.ema(self.ema.initial_carry(batch), batch, target=labels)
                if self.config.model.halting == "q-learning":
                    next_step_continue_target(self.ema, carry, batch, labels, False)
            self._update_flops[key] = count.training_flops * self.tc.batch_size
        return self._update_flops[key]

    def schedule_flops(self, steps: int, done_steps: int, done_flops: int) -> float:
        """The FLOPs of ``steps`` batches under ``train.curriculum`` stretched to them: each batch's ``n_sup``
        supervision steps at its depth's count (:meth:`update_flops`)."""
        total, start = 0.0, 0
        for stage in self.tc.curriculum:  # depth_at: step s runs at the first stage with s < until * steps
            end = min(math.ceil(stage.until * steps), steps)
            if end > start:
                depth = depth_at(start, steps, self.tc.curriculum, self.final_depth)
                total += (end - start) * depth.n_sup * self.update_flops(depth)
            start = max(start, end)
        final = self.final_depth
        return total + (steps - start) * final.n_sup * self.update_flops(final)

    def train_record(self, seen: int, rate: float, lr: float) -> tuple[dict[str, Any], str]:
        window, n_total = self.window, self.window.pop("n")
        record: dict[str, Any] = {"lr": lr}
        record.update({k: window[k] / n_total for k in ("loss", "grad_norm", *self.parts)})
        done, done_exact, done_steps = dist.all_reduce_sum(
            [window.get(k, 0.0) for k in ("finished", "finished_exact", "finished_steps")], self.ctx
        )
        record["final_exact"] = done_exact / max(done, 1.0)
        if self.tc.replace_halted:
            record["halt_steps"] = done_steps / max(done, 1.0)
        record["examples_per_s"] = rate
        record["examples_seen"] = seen
        self.window = {}
        line = (
            f"loss {record['loss']:.4f}  ce {record['ce']:.4f}  kl {record['kl']:.3f}"
            f"  exact {record['final_exact']:.3f}  {record['examples_per_s']:.1f} ex/s"
        )
        if "halt_steps" in record:
            line += f"  halted after {record['halt_steps']:.1f} steps"
        return record, line

    def evaluate(self, step: int) -> tuple[dict[str, Any], str]:
        split = "validation" if "validation" in self.data else "test"
        record = evaluate_ema(self.ema, self.task, self.data[split], self.tc.eval_size, step, self.ctx)
        line = f"eval step {step}: accuracy {record['accuracy']:.4f} (1 sample, {record['num_steps']} steps)"
        if split == "validation":
            record["split"] = split
            line += " on the validation split"
        if self.ema.has_posterior and self.ctx.is_main:  # what the prior has learned of the posterior
            record["gap"] = prior_posterior_gap(self.ema, self.task, self.data["train"], seed=step)
            line += f"; {gap_line(record['gap'])}"
        return record, line

    def saved_parts(self, optimizer: torch.optim.Optimizer) -> tuple[Any, torch.optim.Optimizer]:
        slots = dist.gather_objects(self.samples.state_dict(), self.ctx) if self.tc.replace_halted else []
        self.weights.slots = slots
        return self.weights, optimizer

    def checkpoint_state(self) -> dict[str, Any]:
        return {"arch": self.config.arch}

    def counts(self, seen: int) -> dict[str, int]:
        return {
            "tokens_seen": seen * self.config.model.seq_len,
            "examples_seen": seen,
            "parameters": num_parameters(self.model),
        }


class FixedBatches:
    """Every batch (:func:`train_batch` of the step, this rank's share) runs all ``n_sup`` supervision steps
    from the initial carry."""

    def __init__(
        self,
        model: Reasoner,
        task: Task,
        split: dict[str, np.ndarray],
        tc: ReasonerTrainConfig,
        ctx: dist.DistContext,
        device: str,
    ) -> None:
        self.model, self.task, self.split = model, task, split
        self.tc, self.ctx, self.device = tc, ctx, device
        # The supervision steps of the current batch (the objective sets it from the curriculum); the update
        # index of the model's full depth keeps the refill seeds apart whatever the curriculum does.
        self.n_sup = self.full_n_sup = model.config.n_sup
        self.batch: dict[str, torch.Tensor] = {}
        self.labels = torch.empty(0)
        self.carry: dict[str, torch.Tensor] = {}
        self.loaded = 0  # fresh samples taken by this rank since the last take_loaded()

    def next(self, step: int, n: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict, Any]:
        """``(batch, labels, carry, last)`` of supervision step ``n`` of batch ``step``; ``last`` (a bool, or a
        ``[B]`` bool tensor) says which samples take their final step."""
        if n == 0:
            inputs, labels, puzzle_ids = train_batch(
                self.task, self.split, step, self.tc.batch_size, self.tc.seed, self.tc.augment
            )
            self._load(inputs, labels, puzzle_ids)
        return self.batch, self.labels, self.carry, n == self.n_sup - 1

    def step_index(self, n: int) -> torch.Tensor:
        """Each sample's supervision step (0-based) in update ``n`` of the batch, ``[B]``."""
        return torch.full((len(self.labels),), n, device=self.labels.device)

    def _load(self, inputs: torch.Tensor, labels: torch.Tensor, puzzle_ids: torch.Tensor) -> None:
        ctx, device = self.ctx, self.device
        self.batch = {"inputs": dist.shard(inputs, ctx).to(device)}
        if self.model.config.puzzles:
            self.batch["puzzle_ids"] = dist.shard(puzzle_ids, ctx).to(device)
        self.labels = dist.shard(labels, ctx).to(device)
        self.carry = self.model.initial_carry(self.batch)
        self.loaded += len(self.labels)

    def advance(self, carry: dict[str, torch.Tensor], out: Any, last: Any) -> dict[str, float]:
        """Take the carry a supervision step returned; the samples that finished and how (``finished``,
        ``finished_exact``, ``finished_steps``: sums over this rank's samples)."""
        self.carry = carry
        if not last:
            return {}
        exact = answer_exact(out.logits.float(), self.labels)
        return {
            "finished": len(exact),
            "finished_exact": float(exact.sum()),
            "finished_steps": len(exact) * self.n_sup,
        }

    def take_loaded(self) -> int:
        loaded, self.loaded = self.loaded, 0
        return loaded

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass


class HaltedReplacement(FixedBatches):
    """HRM/TRM's ACT training: the batch is this rank's share of ``batch_size`` *slots*, each holding one sample
    at its own supervision step.

    Before an update the slots whose sample halted take fresh samples (drawn by a generator seeded with
    ``(seed, rank, update)``) and the initial carry. After it a sample halts when its Q-head says so
    (``q_halt > 0``; ``q_halt > q_continue`` under Q-learning halting) or when it has had ``n_sup`` steps. With
    probability ``halt_exploration`` per step a sample is held for a random 2..``n_sup`` steps instead (HRM's
    exploration), so that early halting leaves the later steps some training. The samples in flight go into
    every checkpoint, so a resumed run continues exactly.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        size = self.tc.batch_size // self.ctx.world_size  # equal shards (dist.check_batch)
        length = self.model.config.seq_len
        self.inputs = torch.zeros(size, length, dtype=torch.long, device=self.device)
        self.labels = torch.full((size, length), IGNORE_LABEL, dtype=torch.long, device=self.device)
        self.puzzle_ids = torch.zeros(size, dtype=torch.long, device=self.device)
        self.steps = torch.zeros(size, dtype=torch.long, device=self.device)
        self.halted = torch.ones(size, dtype=torch.bool, device=self.device)
        # The slots are refilled in place, so the batch is built once.
        self.batch = {"inputs": self.inputs}
        if self.model.config.puzzles:
            self.batch["puzzle_ids"] = self.puzzle_ids

    def next(self, step: int, n: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict, Any]:
        fresh = self.halted
        count = int(fresh.sum())
        if count:
            rng = np.random.default_rng(
                [self.tc.seed, _REFILL_STREAM, self.ctx.rank, step * self.full_n_sup + n]
            )
            inputs, labels, puzzle_ids = draw_examples(self.task, self.split, rng, count, self.tc.augment)
            self.inputs[fresh], self.labels[fresh] = inputs.to(self.device), labels.to(self.device)
            self.puzzle_ids[fresh] = puzzle_ids.to(self.device)
            self.steps[fresh] = 0
            self.loaded += count
            initial = self.model.initial_carry(self.batch)
            self.carry = {
                key: torch.where(fresh.view(-1, *[1] * (value.dim() - 1)), value, self.carry.get(key, value))
                for key, value in initial.items()
            }
        self.halted = torch.zeros_like(self.halted)
        # >=: a curriculum that shortens n_sup leaves older samples past the new last step.
        return self.batch, self.labels, self.carry, self.steps >= self.n_sup - 1

    def step_index(self, n: int) -> torch.Tensor:
        return self.steps

    @torch.no_grad()
    def advance(self, carry: dict[str, torch.Tensor], out: Any, last: Any) -> dict[str, float]:
        self.carry = carry
        self.steps += 1
        halts = halt_decision(out.halt_logit, out.continue_logit, self.model.config.halting)
        explore = torch.rand(len(halts), device=halts.device) < self.tc.halt_exploration
        # At n_sup = 1 every sample halts after its one step, whatever it is held for.
        held_for = torch.randint(2, max(self.n_sup, 2) + 1, (len(halts),), device=halts.device)
        halts &= self.steps >= torch.where(explore, held_for, 0)
        self.halted = halts | (self.steps >= self.n_sup)
        exact = answer_exact(out.logits.float(), self.labels)[self.halted]
        return {
            "finished": float(self.halted.sum()),
            "finished_exact": float(exact.sum()),
            "finished_steps": float(self.steps[self.halted].sum()),
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The samples in flight (CPU tensors)."""
        state = {"inputs": self.inputs, "labels": self.labels, "puzzle_ids": self.puzzle_ids}
        state |= {"steps": self.steps, "halted": self.halted}
        state |= {f"carry.{key}": value for key, value in self.carry.items()}
        return {key: value.detach().cpu().contiguous() for key, value in state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key in ("inputs", "labels", "puzzle_ids", "steps", "halted"):
            getattr(self, key).copy_(state[key])
        # Checkpoints written before the IGNORE_LABEL convention hold the stored 0 there; no scored label is 0.
        self.labels.masked_fill_(self.labels == STORED_IGNORE, IGNORE_LABEL)
        self.carry = {
            key.removeprefix("carry."): value.to(self.device)
            for key, value in state.items()
            if key.startswith("carry.")
        }


# Loss ----------------------------------------------------------------------------------------------------------
@torch.no_grad()
def nearest_labels(
    task: Task, inputs: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor, unguided: torch.Tensor
) -> torch.Tensor:
    """``labels`` with the rows marked ``unguided`` ``[B]`` replaced by their puzzle's valid answer likeliest
    under ``logits`` (:meth:`~latentloop.tasks.base.Task.nearest_completion`; unscored positions stay unscored):
    a sample whose noise came from the prior is taught to finish the answer it chose, not the label's."""
    nearest = task.nearest_completion(inputs, logits.detach().float())
    replace = unguided[:, None] & (labels != IGNORE_LABEL)
    return torch.where(replace, nearest, labels)


def stablemax_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities under stable-max (TRM): ``s(x) = x + 1`` for ``x >= 0`` else ``1 / (1 - x)``."""
    s = torch.where(logits >= 0, logits + 1, 1 / (1 - logits.clamp(max=0)))
    return torch.log(s / s.sum(-1, keepdim=True))


def supervision_loss(
    out: Any,
    labels: torch.Tensor,
    beta: float,
    tc: ReasonerTrainConfig,
    continue_target: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    prior_ce: float = 0.0,
    verdict: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one supervision step and its parts (positions labelled ``IGNORE_LABEL`` are not scored).

    ``continue_target`` ``[B]`` (Q-learning halting, see :func:`next_step_continue_target`) adds the BCE of
    ``out.continue_logit`` against it to the halting loss. ``weights`` ``[B]`` weigh each sample's loss (the
    supervision-step weights of :mod:`latentloop.train.curriculum`); the parts are reported unweighted.
    ``prior_ce`` weighs the cross-entropy of ``out.prior_logits`` (GRAM's prior's decode, ``model.prior_ce``).
    ``verdict`` ``[B]`` (GRAM's ``model.heads=prior``: the verifier on the answer the heads' state decodes to)
    is then the target of both the halt and the value head, in place of the exact match and the token accuracy
    of ``out.logits``.
    """
    mask = labels != IGNORE_LABEL
    scored = mask.sum(-1).clamp(min=1)

    def ce_of(logits: torch.Tensor) -> torch.Tensor:
        log_probs = stablemax_log_probs(logits) if tc.stablemax else F.log_softmax(logits, -1)
        token_nll = -log_probs.gather(-1, label_tokens(labels).unsqueeze(-1)).squeeze(-1)
        return (token_nll * mask).sum(-1) / scored

    logits = out.logits.float()
    ce_rows = ce_of(logits)
    if out.loss is not None:  # the generative baselines' own objective (AR, MDLM)
        ce_rows = out.loss.float()
    ce = posterior_ce = ce_rows.mean()
    extra: dict[str, float] = {}
    if prior_ce and out.prior_logits is not None:
        prior_rows = ce_of(out.prior_logits.float())
        extra["prior_ce"] = float(prior_rows.mean().detach())
        ce_rows = ce_rows + prior_ce * prior_rows
        ce = posterior_ce + prior_ce * prior_rows.mean()
    with torch.no_grad():
        accuracy = ((logits.argmax(-1) == labels) & mask).sum(-1) / scored
        exact = answer_exact(logits, labels).float()
    halt_target, value_target = (exact, accuracy) if verdict is None else (verdict, verdict)
    kl = out.kl.float().mean()
    halt = F.binary_cross_entropy_with_logits(out.halt_logit.float(), halt_target)
    if continue_target is not None:
        halt = halt + F.binary_cross_entropy_with_logits(out.continue_logit.float(), continue_target.float())
    value = F.mse_loss(out.value.float(), value_target)
    if weights is None:
        loss = ce + beta * kl + tc.halt_weight * halt + tc.value_weight * value
    else:
        halt_rows = F.binary_cross_entropy_with_logits(out.halt_logit.float(), halt_target, reduction="none")
        if continue_target is not None:
            halt_rows = halt_rows + F.binary_cross_entropy_with_logits(
                out.continue_logit.float(), continue_target.float(), reduction="none"
            )
        rows = ce_rows + beta * out.kl.float() + tc.halt_weight * halt_rows
        rows = rows + tc.value_weight * (out.value.float() - value_target) ** 2
        loss = (rows * weights).mean()
    parts = {
        "ce": float(posterior_ce.detach()),
        "kl": float(kl.detach()),
        "halt_loss": float(halt.detach()),
        "value_loss": float(value.detach()),
        "token_acc": float(accuracy.mean()),
        "exact": float(exact.mean()),
        **extra,
    }
    if verdict is not None:
        parts["prior_valid"] = float(verdict.mean())
    return loss, parts


@torch.no_grad()
def next_step_continue_target(
    model: Reasoner,
    carry: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    labels: torch.Tensor,
    last: bool | torch.Tensor,
) -> torch.Tensor:
    """The Q-learning target of ``q_continue`` for the supervision step that returned ``carry``: one more
    step without gradient from that (detached) carry, with the current weights, then
    :func:`~latentloop.models.reasoners.heads.continue_target` of its Q logits (as HRM: no target network)."""
    _, ahead = model(carry, batch, target=labels)
    return continue_target(ahead.halt_logit, ahead.continue_logit, last)


def ema_decay(target: float, update: int) -> float:
    """The EMA decay at optimizer update ``update`` (0-based): ``min(target, (1 + t) / (10 + t))``.

    A fixed decay of 0.999 would keep most of the random initial weights for the first thousand updates, longer
    than a short CPU run lasts; the warm-up lets the average follow the weights early and settle at ``target``.
    """
    return min(target, (1 + update) / (10 + update))


# Checkpoints ---------------------------------------------------------------------------------------------------
class _TrainingWeights:
    """What :func:`save_checkpoint` saves as "the model": the EMA weights for evaluation (model.safetensors) and
    the raw weights for resuming (train_model.safetensors)."""

    def __init__(self, model: Reasoner, ema: Reasoner) -> None:
        self.model, self.ema = model, ema
        # Every rank's samples in flight (train.replace_halted), gathered before each save.
        self.slots: list[dict[str, torch.Tensor]] = []

    def save_pretrained(self, path: str | Path) -> None:
        self.ema.save_pretrained(path)
        self.model.save_pretrained(path, weights=TRAIN_WEIGHTS)
        if self.slots:
            tensors = {
                f"{rank}.{key}": value
                for rank, state in enumerate(self.slots)
                for key, value in state.items()
            }
            save_file(tensors, Path(path) / SLOTS_FILE)


def _restore_slots(
    samples: FixedBatches, checkpoint: Path, ctx: dist.DistContext, log: Callable[[str], None] | None
) -> None:
    """Put back the samples in flight of a ``train.replace_halted`` checkpoint; without them (another process
    count or batch size, or a checkpoint written without replacement) the slots start with fresh samples."""
    file, prefix = checkpoint / SLOTS_FILE, f"{ctx.rank}."
    saved = load_file(str(file)) if file.is_file() else {}
    state = {key.removeprefix(prefix): value for key, value in saved.items() if key.startswith(prefix)}
    mine = samples.state_dict()  # no carry yet: that comes with the first samples
    if not mine.keys() <= state.keys() or any(state[k].shape != mine[k].shape for k in mine):
        if log:
            log(
                f"{checkpoint.name} holds no samples in flight for these slots: they start with fresh samples"
            )
        return
    samples.load_state_dict(state)


def _check_architecture(checkpoint: Path, model: Reasoner) -> None:
    saved = json.loads((checkpoint / "config.json").read_text())
    mine = model.config_dict()
    # The values of checkpoints written before these options existed.
    defaults = {
        "puzzles": 0,
        "puzzle_tokens": 1,
        "puzzle_dim": 0,
        "norm_weight": True,
        "h_layers": 0,
        "rope_layout": "pairs",
    }
    keys = (
        "arch",
        "vocab_size",
        "seq_len",
        "dim",
        "n_heads",
        "n_layers",
        "hidden",
        "block",
        "mixer",
        *defaults,
    )
    for key in keys:
        if saved.get(key, defaults.get(key)) != mine.get(key):
            raise UsageError(
                f"the run folder's checkpoint {checkpoint.name} has {key}={saved.get(key)}, the config asks for "
                f"{mine.get(key)}; use a new --out folder to start afresh"
            )


def evaluate_ema(
    ema: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    limit: int,
    step: int,
    ctx: dist.DistContext = dist.SINGLE,
) -> dict[str, Any]:
    """Held-out accuracy of the EMA weights as inference runs them (GRAM sampling its prior). With several
    processes each rank solves a contiguous share of the puzzles and the counts are summed."""
    was_training = ema.training
    if ctx.enabled:
        distinct = unique_rows(split, limit)
        start, stop = dist.shard_bounds(len(distinct), ctx)
        rows = distinct[start:stop]
        mine = {k: np.asarray(split[k])[rows] for k in ("inputs", "labels", "puzzle_ids")}
        result = quick_accuracy(ema.eval(), task, mine, len(rows)) if len(rows) else {}
        correct, total = dist.all_reduce_sum([result.get("accuracy", 0.0) * len(rows), len(rows)], ctx)
        accuracy = correct / max(total, 1.0)
        result = {
            "num_steps": result.get("num_steps", ema.config.n_sup),
            "accuracy": accuracy,
            "exact_match": accuracy,
        }
    else:
        result = quick_accuracy(ema.eval(), task, split, limit)
    record = {"kind": "eval", "step": step, **result}
    ema.train(was_training)
    return record


def model_noise_seed(seed: int, step: int, rank: int) -> int:
    """Seed of the torch RNG for batch ``step`` on ``rank``, which draws the models' own noise (GRAM's ε,
    MDLM's masking times and masks). A pure function, so a resumed run draws what the uninterrupted run drew,
    whatever the process count; distinct per rank, so that ranks, holding different rows, draw independent
    noise."""
    return int(np.random.SeedSequence([_NOISE_STREAM, seed, step, rank]).generate_state(1, np.uint64)[0])
