"""Deep-supervision training for the puzzle reasoners (Direct, Looped, HRM, TRM, GRAM).

One training *step* takes a batch (a pure function of ``(seed, step)``, augmented on the fly where the task
allows it), starts from the model's initial carry and runs ``model.n_sup`` supervision steps. Each supervision
step is one forward (``T`` transitions, gradient only through the last), one backward and one AdamW update;
the carry is detached between them. The whole batch runs all ``n_sup`` steps (no replacement of halted
samples), which keeps every step's cost and randomness fixed. Loss of a supervision step::

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


@dataclass
class ReasonerTrainConfig(TrainConfig):
    """:class:`TrainConfig` plus the deep-supervision settings. ``steps`` counts batches (each ``n_sup``
    optimizer updates); ``warmup_steps`` counts optimizer updates."""

    ema: float = 0.999
    stablemax: bool = False
    halt_weight: float = 0.5
    value_weight: float = 0.5
    augment: bool = True
    train_size: int | None = None
    test_size: int | None = None
    data: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.ema < 1:
            raise UsageError(f"train.ema must be in [0, 1), got {self.ema}")
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
    rng = np.random.default_rng([seed, step])
    rows = rng.integers(0, len(split["inputs"]), batch_size)
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
        hits = (logits.argmax(-1) == labels) & mask
        accuracy = hits.sum(-1) / scored
        exact = (hits | ~mask).all(-1).float()
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
    last: bool,
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

    def save_pretrained(self, path: str | Path) -> None:
        self.ema.save_pretrained(path)
        self.model.save_pretrained(path, weights=TRAIN_WEIGHTS)


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
                inputs, labels, puzzle_ids = train_batch(
                    task, data["train"], step, tc.batch_size, tc.seed, tc.augment
                )
                torch.manual_seed(model_noise_seed(tc.seed, step, ctx.rank))
                inputs, labels = dist.shard(inputs, ctx).to(device), dist.shard(labels, ctx).to(device)
                batch = {"inputs": inputs}
                if config.model.puzzles:
                    batch["puzzle_ids"] = dist.shard(puzzle_ids, ctx).to(device)
                carry = model.initial_carry(batch)
                for n in range(n_sup):
                    update = step * n_sup + n
                    lr = lr_at(update, tc.lr, tc.warmup_steps, total_updates, tc.min_lr_ratio)
                    set_lr(optimizer, lr)
                    with torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        carry, output = model(carry, batch, target=labels)
                        target_q = None
                        if config.model.halting == "q-learning":
                            target_q = next_step_continue_target(model, carry, batch, labels, n == n_sup - 1)
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
                    losses.append(value)
                    for key, v in {"loss": value, "grad_norm": float(grad_norm), **parts}.items():
                        window[key] = window.get(key, 0.0) + v
                    window["n"] = window.get("n", 0.0) + 1
                # Accuracy after the batch's last supervision step is what inference would return.
                window["final_exact"] = window.get("final_exact", 0.0) + parts["exact"]
                window["batches"] = window.get("batches", 0.0) + 1
                window["time"] = window.get("time", 0.0) + time.perf_counter() - tick
                step += 1
                examples_seen += tc.batch_size
                accuracy = last_eval["accuracy"] if last_eval is not None else None
                bar.update(step, value, tc.batch_size / max(time.perf_counter() - tick, 1e-9), accuracy)
                if step % tc.log_every == 0 or step == end_step:
                    n_total, batches = window.pop("n"), window.pop("batches")
                    record: dict[str, Any] = {"kind": "train", "step": step, "lr": lr}
                    record.update({k: window[k] / n_total for k in ("loss", "grad_norm", *parts)})
                    record["final_exact"] = window["final_exact"] / batches
                    record["examples_per_s"] = batches * tc.batch_size / max(window["time"], 1e-9)
                    record["examples_seen"] = examples_seen
                    record["elapsed_s"] = round(time.perf_counter() - started, 3)
                    metrics.write(record)
                    if log:
                        log(
                            f"step {step:>6}  loss {record['loss']:.4f}  ce {record['ce']:.4f}  kl {record['kl']:.3f}"
                            f"  exact {record['final_exact']:.3f}  {record['examples_per_s']:.1f} ex/s"
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
