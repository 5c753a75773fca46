"""Deep-supervision training for the puzzle reasoners (Direct, Looped, HRM, TRM, GRAM).

One training *step* takes a batch (a pure function of ``(seed, step)``, augmented on the fly where the task
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
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from latentloop.config import load_yaml
from latentloop.data.dataset import build_dataset, load_dataset
from latentloop.errors import UsageError
from latentloop.models.reasoners import REASONERS, Reasoner, ReasonerConfig, build_reasoner, num_parameters
from latentloop.models.reasoners.heads import continue_target
from latentloop.runtime import settle_vector_math
from latentloop.tasks.base import Task, get_task
from latentloop.train import distributed as dist
from latentloop.train.checkpoint import (
    capture_rank_rng,
    checkpoint_name,
    latest_checkpoint,
    load_training_state,
    restore_training_rng,
    save_checkpoint,
)
from latentloop.train.optim import build_optimizer, lr_at, set_lr
from latentloop.train.trainer import (
    TaskConfig,
    TrainConfig,
    TrainingError,
    _InterruptFlag,
    _Metrics,
    _ProgressBar,
    _seed_everything,
    build_run_config,
    compile_for_training,
    measure_matmul_speed,
    resolve_device,
    resumed_precision,
    save_run_config,
)

TRAIN_WEIGHTS = "train_model.safetensors"
_NOISE_STREAM = 0x4E015E  # keeps model-noise seeds apart from data seeds of the same (seed, step)
_REFILL_STREAM = 0x5EF111  # the fresh samples of train.replace_halted, apart from the batches of train_batch
SLOTS_FILE = "slots.safetensors"  # train.replace_halted: the samples in flight when a checkpoint was written


@dataclass
class ReasonerTrainConfig(TrainConfig):
    """:class:`TrainConfig` plus the deep-supervision settings. ``steps`` counts batches (each ``n_sup``
    optimizer updates); ``warmup_steps`` counts optimizer updates."""

    ema: float = 0.999
    stablemax: bool = False
    halt_weight: float = 0.5
    value_weight: float = 0.5
    augment: bool = True
    # HRM/TRM's ACT training: a sample that the Q-head halts is replaced by a fresh one (see HaltedReplacement)
    replace_halted: bool = False
    halt_exploration: float = 0.1  # chance per step that a sample is held for a random 2..n_sup steps
    train_size: int | None = None
    test_size: int | None = None
    data: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.ema < 1:
            raise UsageError(f"train.ema must be in [0, 1), got {self.ema}")
        if not 0 <= self.halt_exploration <= 1:
            raise UsageError(f"train.halt_exploration must be in [0, 1], got {self.halt_exploration}")
        if self.parallel != "ddp":
            raise UsageError(
                f"train.parallel={self.parallel} is for the recurrent-depth LM; reasoners train with ddp"
            )


@dataclass
class ReasonerRunConfig:
    """A reasoner run: ``arch`` (direct, looped, hrm, trm, gram) and the ``model``, ``train``, ``task`` sections."""

    arch: str = "gram"
    model: ReasonerConfig = field(default_factory=ReasonerConfig)
    train: ReasonerTrainConfig = field(default_factory=ReasonerTrainConfig)
    task: TaskConfig = field(default_factory=lambda: TaskConfig(name="nqueens"))


def build_reasoner_config(
    data: dict[str, Any] | None = None,
    overrides: Sequence[str] = (),
    task: str | None = None,
    arch: str | None = None,
) -> ReasonerRunConfig:
    """A :class:`ReasonerRunConfig` from YAML-style data, a task spec, an arch and ``key=value`` overrides."""
    data = dict(data or {})
    data.setdefault("task", {"name": "nqueens"})
    return build_run_config(
        data, overrides, task=task, arch=arch, config_cls=ReasonerRunConfig, archs=tuple(REASONERS)
    )


def load_reasoner_run_config(path: str | Path) -> ReasonerRunConfig:
    """The run config saved as ``OUT/config.yaml``."""
    return build_reasoner_config(load_yaml(path))


def fit_to_task(config: ReasonerConfig, task: Task) -> ReasonerConfig:
    """``config`` with the task's vocabulary and length filled in; a config that does not fit is an error."""
    fitted = copy.deepcopy(config)
    for name, need in (("vocab_size", int(task.vocab_size)), ("seq_len", int(task.seq_len))):
        have = getattr(fitted, name)
        if have == 0:
            setattr(fitted, name, need)
        elif have != need:
            raise UsageError(
                f"model.{name}={have} does not fit task {task.name!r} ({name} {need}); "
                f"set model.{name}={need} or 0 (from the task)"
            )
    return fitted


# Data ----------------------------------------------------------------------------------------------------------
def task_data(config: ReasonerRunConfig, out: Path) -> tuple[Task, dict[str, dict[str, np.ndarray]]]:
    """The task and its train/test arrays: ``train.data`` if given, else built once into ``OUT/data``."""
    tc = config.train
    task = get_task(config.task.name, **config.task.options)
    folder = Path(tc.data) if tc.data else out / "data"
    if not tc.data and not (folder / "metadata.json").is_file():
        build_dataset(task, folder, size=tc.train_size, test_size=tc.test_size, seed=tc.seed, progress=False)
    dataset = load_dataset(folder)
    meta = dataset.metadata
    if meta.get("task") != task.name or int(meta.get("seq_len", -1)) != task.seq_len:
        raise UsageError(
            f"dataset {folder} holds {meta.get('task')!r} with seq_len {meta.get('seq_len')}, "
            f"the config asks for {task.name!r} with seq_len {task.seq_len}"
        )
    return task, {s: {k: np.asarray(v) for k, v in dataset.split(s).items()} for s in ("train", "test")}


def _augment_nqueens(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, n: int) -> None:
    from latentloop.data.augment import dihedral

    for i, k in enumerate(rng.integers(0, 8, len(x))):
        x[i] = dihedral(x[i].reshape(n, n), int(k)).reshape(-1)
        y[i] = dihedral(y[i].reshape(n, n), int(k)).reshape(-1)


def _augment_sudoku(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, task: Any) -> None:
    from latentloop.tasks.sudoku import augment

    for i in range(len(x)):
        p, s = augment(task.decode(x[i]), task.decode(y[i]), rng, task.box)
        x[i], y[i] = task.encode(p), task.encode(s)


def train_batch(
    task: Task, split: dict[str, np.ndarray], step: int, batch_size: int, seed: int, augment: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(inputs, labels, puzzle_ids)`` of batch ``step``: rows drawn with replacement by a generator seeded
    with ``(seed, step)``, then a validity-preserving transform per row (N-Queens: the 8 symmetries of the
    board; Sudoku: digit, band and stack shuffles). Graph colouring has no augmentation (its labels are
    canonical colourings), nor has ARC here (its augmented copies are rows of the dataset, each with its own
    puzzle id)."""
    return draw_examples(task, split, np.random.default_rng([seed, step]), batch_size, augment)


def draw_examples(
    task: Task, split: dict[str, np.ndarray], rng: np.random.Generator, count: int, augment: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` rows of ``split`` drawn with replacement by ``rng``, augmented (see :func:`train_batch`)."""
    rows = rng.integers(0, len(split["inputs"]), count)
    x, y = split["inputs"][rows].copy(), split["labels"][rows].copy()
    if augment and task.name == "nqueens":
        _augment_nqueens(x, y, rng, task.n)  # type: ignore[attr-defined]
    elif augment and task.name == "sudoku":
        _augment_sudoku(x, y, rng, task)
    puzzle_ids = np.asarray(split["puzzle_ids"])[rows].astype(np.int64)
    return (
        torch.from_numpy(x.astype(np.int64)),
        torch.from_numpy(y.astype(np.int64)),
        torch.from_numpy(puzzle_ids),
    )


def fit_puzzle_embeddings(config: ReasonerConfig, task: Task, data: dict[str, dict[str, np.ndarray]]) -> None:
    """Give ``config`` one puzzle embedding per puzzle id of the dataset when the task needs them (ARC)."""
    if not getattr(task, "puzzle_embeddings", False):
        return
    needed = 1 + max(int(np.max(split["puzzle_ids"], initial=-1)) for split in data.values())
    if config.puzzles and config.puzzles < needed:
        raise UsageError(f"model.puzzles={config.puzzles} is too few: the dataset has {needed} puzzle ids")
    config.puzzles = config.puzzles or needed


# The samples of each update ---------------------------------------------------------------------------------------
def answer_exact(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the argmax answer matches every scored label (labels 0 are not scored)."""
    return ((logits.argmax(-1) == labels) | (labels == 0)).all(-1)


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
        self.n_sup = model.config.n_sup
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
        self.labels = torch.zeros(size, length, dtype=torch.long, device=self.device)
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
            rng = np.random.default_rng([self.tc.seed, _REFILL_STREAM, self.ctx.rank, step * self.n_sup + n])
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
        return self.batch, self.labels, self.carry, self.steps == self.n_sup - 1

    @torch.no_grad()
    def advance(self, carry: dict[str, torch.Tensor], out: Any, last: Any) -> dict[str, float]:
        self.carry = carry
        self.steps += 1
        q_halt = out.halt_logit.float()
        if self.model.config.halting == "q-learning":
            halts = q_halt > out.continue_logit.float()
        else:
            halts = q_halt > 0
        explore = torch.rand(len(halts), device=halts.device) < self.tc.halt_exploration
        held_for = torch.randint(2, self.n_sup + 1, (len(halts),), device=halts.device)
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
        self.carry = {
            key.removeprefix("carry."): value.to(self.device)
            for key, value in state.items()
            if key.startswith("carry.")
        }


# Loss ----------------------------------------------------------------------------------------------------------
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one supervision step and its parts (labels 0 are not scored).

    ``continue_target`` ``[B]`` (Q-learning halting, see :func:`next_step_continue_target`) adds the BCE of
    ``out.continue_logit`` against it to the halting loss.
    """
    mask = labels != 0
    logits = out.logits.float()
    log_probs = stablemax_log_probs(logits) if tc.stablemax else F.log_softmax(logits, -1)
    token_nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    scored = mask.sum(-1).clamp(min=1)
    ce = ((token_nll * mask).sum(-1) / scored).mean()
    if getattr(out, "loss", None) is not None:  # the generative baselines' own objective (AR, MDLM)
        ce = out.loss.float().mean()
    with torch.no_grad():
        accuracy = ((logits.argmax(-1) == labels) & mask).sum(-1) / scored
        exact = answer_exact(logits, labels).float()
    kl = out.kl.float().mean()
    halt = F.binary_cross_entropy_with_logits(out.halt_logit.float(), exact)
    if continue_target is not None:
        halt = halt + F.binary_cross_entropy_with_logits(out.continue_logit.float(), continue_target.float())
    value = F.mse_loss(out.value.float(), accuracy)
    loss = ce + beta * kl + tc.halt_weight * halt + tc.value_weight * value
    parts = {
        "ce": float(ce.detach()),
        "kl": float(kl.detach()),
        "halt_loss": float(halt.detach()),
        "value_loss": float(value.detach()),
        "token_acc": float(accuracy.mean()),
        "exact": float(exact.mean()),
    }
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
    import json

    saved = json.loads((checkpoint / "config.json").read_text())
    mine = model.config_dict()
    defaults = {"puzzles": 0, "puzzle_tokens": 1}  # checkpoints written before puzzle embeddings existed
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


# Training ------------------------------------------------------------------------------------------------------
@dataclass
class ReasonerTrainResult:
    """What a call to :func:`train_reasoner` did. ``losses`` has one entry per supervision step."""

    out_dir: Path
    step: int
    losses: list[float]
    checkpoint: Path | None
    stopped: str
    examples_seen: int
    precision: str
    elapsed_s: float
    resumed_from: int
    parameters: int
    last_eval: dict[str, Any] | None = None


def _evaluate(
    ema: Reasoner,
    task: Task,
    split: dict[str, np.ndarray],
    limit: int,
    step: int,
    metrics: _Metrics,
    log: Callable[[str], None] | None,
    ctx: dist.DistContext = dist.SINGLE,
) -> dict[str, Any]:
    """Held-out accuracy of the EMA weights as inference runs them (GRAM sampling its prior), logged. With
    several processes each rank solves a contiguous share of the puzzles and the counts are summed."""
    from latentloop.eval.reasoners import quick_accuracy, unique_rows

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
    metrics.write(record)
    if log:
        log(f"eval step {step}: accuracy {record['accuracy']:.4f} (1 sample, {record['num_steps']} steps)")
    return record


def _choose_precision(requested: str, config: ReasonerConfig, tokens: int, device: str) -> str:
    if requested != "auto":
        return requested
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    timing = measure_matmul_speed(min(tokens, 4096), config.dim, 2 * config.hidden, device)
    return "bf16" if timing["bf16"] < 0.9 * timing["fp32"] else "fp32"


def model_noise_seed(seed: int, step: int, rank: int) -> int:
    """Seed of the torch RNG for batch ``step`` on ``rank``, which draws the models' own noise (GRAM's ε,
    MDLM's masking times and masks). A pure function, so a resumed run draws what the uninterrupted run drew,
    whatever the process count; distinct per rank, so that ranks, holding different rows, draw independent
    noise."""
    return int(np.random.SeedSequence([_NOISE_STREAM, seed, step, rank]).generate_state(1, np.uint64)[0])


@dist.leaves_group
def train_reasoner(
    config: ReasonerRunConfig,
    out_dir: str | Path,
    progress: bool | str = False,
    log: Callable[[str], None] | None = None,
    stop_at: int | None = None,
) -> ReasonerTrainResult:
    """Train (or resume) the reasoner run in ``out_dir`` until ``train.steps`` batches or the time budget.

    ``progress`` shows a progress bar (a string names the phase on it, e.g. the model's name); ``stop_at``
    ends this call after that many batches (as an interruption would), with a checkpoint.
    Under ``torchrun`` it trains data-parallel (see :mod:`latentloop.train.distributed`): each rank takes a
    slice of the step's batch and every supervision step's update is averaged over ranks, so ranks stay in
    step; only rank 0 writes to ``out_dir``.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    tc, arch = config.train, config.arch
    task = get_task(config.task.name, **config.task.options)
    config.model = fit_to_task(config.model, task)
    settle_vector_math()
    ctx, device = dist.setup(resolve_device(tc.device))
    dist.check_batch(tc.batch_size, ctx)
    if not ctx.is_main:
        progress, log = False, None
    out.mkdir(parents=True, exist_ok=True)
    if ctx.is_main:  # rank 0 builds OUT/data (once) before the other ranks read it
        task, data = task_data(config, out)
    dist.barrier(ctx)
    if not ctx.is_main:
        task, data = task_data(config, out)

    fit_puzzle_embeddings(config.model, task, data)
    if config.model.puzzles and hasattr(REASONERS[arch], "sample"):
        raise UsageError(
            f"{arch} has no puzzle embeddings; task {task.name} needs them (use trm, hrm or gram)"
        )
    _seed_everything(tc.seed)
    model = build_reasoner(arch, config.model).to(device)
    ema = copy.deepcopy(model).requires_grad_(False)  # evaluated with eager kernels: not compiled
    optimizer = build_optimizer(model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
    found = dist.broadcast_object(str(latest_checkpoint(out) or ""), ctx)  # rank 0 picks it for all
    checkpoint = Path(found) if found else None
    start_step, examples_seen = 0, 0
    if checkpoint is not None:
        _check_architecture(checkpoint, model)
        model.load_weights(checkpoint / TRAIN_WEIGHTS)
        ema.load_weights(checkpoint / "model.safetensors")
        state, torch_rng = load_training_state(checkpoint, optimizer)
        start_step, examples_seen = state["step"], int(state.get("examples_seen", 0))
        # The time budget covers the whole run, interrupted or not.
        started -= float(state.get("train_seconds", 0.0))
        restore_training_rng(state, torch_rng, ctx.rank, ctx.world_size)
        if log:
            log(f"resuming from {checkpoint} (step {start_step})")
    if ctx.is_main:
        save_run_config(config, out / "config.yaml")
    model.train()
    if tc.compile:
        compile_for_training(model, device)
    # Ranks start equal and stay equal: the same averaged gradients give the same updates.
    dist.broadcast_module(model, ctx)
    dist.broadcast_module(ema, ctx)
    # "auto" times matmuls, which may come out differently on each rank; rank 0's choice holds for all,
    # and a resumed run keeps the choice it made when it started.
    requested = resumed_precision(tc.precision, state if checkpoint is not None else None)
    precision = dist.broadcast_object(
        _choose_precision(requested, config.model, tc.batch_size * task.seq_len, device), ctx
    )
    autocast_device = "cuda" if device.startswith("cuda") else "cpu"
    n_sup = config.model.n_sup
    total_updates = tc.steps * n_sup
    params, ema_params = list(model.parameters()), list(ema.parameters())  # same order: ema is a deep copy

    metrics = _Metrics(out, start_step, tc.tensorboard, enabled=ctx.is_main)
    end_step = tc.steps if stop_at is None else min(tc.steps, stop_at)
    budget_s = tc.budget_minutes * 60 if tc.budget_minutes else math.inf
    losses: list[float] = []
    window: dict[str, float] = {}
    last_saved, saved_step = checkpoint, (start_step if checkpoint is not None else -1)
    stopped, step = "steps", start_step
    wrapped = _TrainingWeights(model, ema)
    samples = (HaltedReplacement if tc.replace_halted else FixedBatches)(
        model, task, data["train"], tc, ctx, device
    )
    if tc.replace_halted and checkpoint is not None:
        _restore_slots(samples, checkpoint, ctx, log)
    phase = f"{progress} train" if isinstance(progress, str) else "train"
    bar = _ProgressBar(bool(progress), tc.steps, start_step, phase, "ex/s", budget_s, started)

    def trainer_state() -> dict[str, Any]:
        return {
            "examples_seen": examples_seen,
            "precision": precision,
            "seed": tc.seed,
            "arch": arch,
            "train_seconds": time.perf_counter() - started,
            "world_size": ctx.world_size,
        }

    def save(at: int) -> Path:
        # Every rank hands its RNG states to rank 0, which alone writes the checkpoint.
        rank_rng = dist.gather_objects(capture_rank_rng(), ctx)
        wrapped.slots = dist.gather_objects(samples.state_dict(), ctx) if tc.replace_halted else []
        path = out / "checkpoints" / checkpoint_name(at)
        if ctx.is_main:
            path = save_checkpoint(
                out, at, wrapped, optimizer, trainer_state(), tc.keep_checkpoints, rank_rng=rank_rng
            )  # type: ignore[arg-type]
        dist.barrier(ctx)
        return path

    last_eval: dict[str, Any] | None = None
    interrupt = _InterruptFlag()
    try:
        with bar, interrupt:
            while step < end_step:
                unsaved = functools.partial(save, step) if step > saved_step else None
                if interrupt.should_stop(ctx, started, budget_s, checkpoint=unsaved):
                    stopped = "budget"
                    break
                tick = time.perf_counter()
                torch.manual_seed(model_noise_seed(tc.seed, step, ctx.rank))
                for n in range(n_sup):
                    batch, labels, carry, last = samples.next(step, n)
                    update = step * n_sup + n
                    lr = lr_at(update, tc.lr, tc.warmup_steps, total_updates, tc.min_lr_ratio)
                    set_lr(optimizer, lr)
                    with torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        carry, output = model(carry, batch, target=labels)
                        target_q = None
                        if config.model.halting == "q-learning":
                            target_q = next_step_continue_target(model, carry, batch, labels, last)
                        loss, parts = supervision_loss(output, labels, config.model.beta, tc, target_q)
                    value = float(loss.detach())
                    if ctx.enabled:  # equal shards: the mean over ranks is the loss of the whole batch
                        value, *averaged = dist.all_reduce_mean([value, *parts.values()], ctx)
                        parts = dict(zip(parts, averaged, strict=True))
                    if not math.isfinite(value):
                        raise TrainingError(
                            f"loss became {value} at step {step + 1}, supervision step {n + 1} (lr {lr:.3g}); "
                            f"last checkpoint: {last_saved or 'none'}; try a lower train.lr"
                        )
                    loss.backward()
                    # The carry holds outputs that this step's loss does not use, so DDP's hooks would wait
                    # forever; gradients are averaged over ranks explicitly instead.
                    dist.average_gradients(params, ctx)
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        params, tc.grad_clip if tc.grad_clip > 0 else math.inf
                    )
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    with torch.no_grad():
                        torch._foreach_lerp_(ema_params, params, 1.0 - ema_decay(tc.ema, update))
                    carry = {k: v.detach() for k, v in carry.items()}
                    # The samples that finished: their answer is what inference would return.
                    finished = samples.advance(carry, output, last)
                    losses.append(value)
                    for key, v in {"loss": value, "grad_norm": float(grad_norm), **parts, **finished}.items():
                        window[key] = window.get(key, 0.0) + v
                    window["n"] = window.get("n", 0.0) + 1
                (loaded,) = dist.all_reduce_sum([samples.take_loaded()], ctx)
                window["loaded"] = window.get("loaded", 0.0) + loaded
                window["time"] = window.get("time", 0.0) + time.perf_counter() - tick
                step += 1
                examples_seen += int(loaded)
                accuracy = last_eval["accuracy"] if last_eval is not None else None
                bar.update(step, value, loaded / max(time.perf_counter() - tick, 1e-9), accuracy)
                if step % tc.log_every == 0 or step == end_step:
                    n_total = window.pop("n")
                    record: dict[str, Any] = {"kind": "train", "step": step, "lr": lr}
                    record.update({k: window[k] / n_total for k in ("loss", "grad_norm", *parts)})
                    done, done_exact, done_steps = dist.all_reduce_sum(
                        [window.get(k, 0.0) for k in ("finished", "finished_exact", "finished_steps")], ctx
                    )
                    record["final_exact"] = done_exact / max(done, 1.0)
                    if tc.replace_halted:
                        record["halt_steps"] = done_steps / max(done, 1.0)
                    record["examples_per_s"] = window["loaded"] / max(window["time"], 1e-9)
                    record["examples_seen"] = examples_seen
                    record["elapsed_s"] = round(time.perf_counter() - started, 3)
                    metrics.write(record)
                    if log:
                        log(
                            f"step {step:>6}  loss {record['loss']:.4f}  ce {record['ce']:.4f}  kl {record['kl']:.3f}"
                            f"  exact {record['final_exact']:.3f}  {record['examples_per_s']:.1f} ex/s"
                            + (
                                f"  halted after {record['halt_steps']:.1f} steps"
                                if "halt_steps" in record
                                else ""
                            )
                        )
                    window = {}
                if tc.eval_every and tc.eval_size and step % tc.eval_every == 0 and step < end_step:
                    last_eval = _evaluate(ema, task, data["test"], tc.eval_size, step, metrics, log, ctx)
                if tc.checkpoint_every and step % tc.checkpoint_every == 0:
                    last_saved = save(step)
                    saved_step = step
            if stop_at is not None and step >= stop_at and step < tc.steps:
                stopped = "stop_at"
    except BaseException:
        metrics.close()
        raise
    if step != saved_step:
        last_saved = save(step)
    if stopped != "stop_at" and tc.eval_size and (last_eval is None or last_eval["step"] != step):
        last_eval = _evaluate(ema, task, data["test"], tc.eval_size, step, metrics, log, ctx)
    metrics.close()
    return ReasonerTrainResult(
        out_dir=out,
        step=step,
        losses=losses,
        checkpoint=last_saved,
        stopped=stopped,
        examples_seen=examples_seen,
        precision=precision,
        elapsed_s=time.perf_counter() - started,
        resumed_from=start_step,
        parameters=num_parameters(model),
        last_eval=last_eval,
    )
