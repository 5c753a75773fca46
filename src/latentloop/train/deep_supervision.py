"""Deep-supervision training for the puzzle reasoners (Direct, Looped, HRM, TRM, GRAM).

One training *step* takes a batch (a pure function of ``(seed, step)``, augmented on the fly where the task
allows it), starts from the model's initial carry and runs ``model.n_sup`` supervision steps. Each supervision
step is one forward (``T`` transitions, gradient only through the last), one backward and one AdamW update;
the carry is detached between them. The whole batch runs all ``n_sup`` steps (no replacement of halted
samples), which keeps every step's cost and randomness fixed. Loss of a supervision step::

    CE(logits, y) on scored positions (stable-max CE as an option)
    + β · KL(posterior || prior)                                  GRAM only (KL is 0 for the others)
    + halt_weight · BCE(q_halt, answer fully correct)            the simple ACT variant of TRM/GRAM
    + value_weight · MSE(v(z), token accuracy of this answer)    the value head (LPRM)

An EMA of the weights is kept and is what checkpoints' ``model.safetensors`` (and so ``latentloop eval``) hold;
the raw weights go beside it in ``train_model.safetensors`` for resuming. Checkpoints are written between
batches, so a resumed run reproduces the uninterrupted run's losses exactly on the same machine.
"""

from __future__ import annotations

import copy
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
from latentloop.tasks.base import Task, get_task
from latentloop.train.checkpoint import (
    latest_checkpoint,
    load_training_state,
    restore_rng_state,
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
    measure_matmul_speed,
    resolve_device,
    save_run_config,
)

TRAIN_WEIGHTS = "train_model.safetensors"


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: rows drawn with replacement by a generator seeded with ``(seed, step)``, then
    a validity-preserving transform per row (N-Queens: the 8 symmetries of the board; Sudoku: digit, band and
    stack shuffles). Graph colouring has no augmentation: its labels are canonical colourings."""
    rng = np.random.default_rng([seed, step])
    rows = rng.integers(0, len(split["inputs"]), batch_size)
    x, y = split["inputs"][rows].copy(), split["labels"][rows].copy()
    if augment and task.name == "nqueens":
        _augment_nqueens(x, y, rng, task.n)  # type: ignore[attr-defined]
    elif augment and task.name == "sudoku":
        _augment_sudoku(x, y, rng, task)
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


# Loss ----------------------------------------------------------------------------------------------------------
def stablemax_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities under stable-max (TRM): ``s(x) = x + 1`` for ``x >= 0`` else ``1 / (1 - x)``."""
    s = torch.where(logits >= 0, logits + 1, 1 / (1 - logits.clamp(max=0)))
    return torch.log(s / s.sum(-1, keepdim=True))


def supervision_loss(
    out: Any, labels: torch.Tensor, beta: float, tc: ReasonerTrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one supervision step and its parts (labels 0 are not scored)."""
    mask = labels != 0
    logits = out.logits.float()
    log_probs = stablemax_log_probs(logits) if tc.stablemax else F.log_softmax(logits, -1)
    token_nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    scored = mask.sum(-1).clamp(min=1)
    ce = ((token_nll * mask).sum(-1) / scored).mean()
    with torch.no_grad():
        hits = (logits.argmax(-1) == labels) & mask
        accuracy = hits.sum(-1) / scored
        exact = (hits | ~mask).all(-1).float()
    kl = out.kl.float().mean()
    halt = F.binary_cross_entropy_with_logits(out.halt_logit.float(), exact)
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
    for key in ("arch", "vocab_size", "seq_len", "dim", "n_heads", "n_layers", "hidden", "block", "mixer"):
        if saved.get(key) != mine.get(key):
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
) -> dict[str, Any]:
    """Held-out accuracy of the EMA weights as inference runs them (GRAM sampling its prior), logged."""
    from latentloop.eval.reasoners import quick_accuracy

    was_training = ema.training
    record = {"kind": "eval", "step": step, **quick_accuracy(ema.eval(), task, split, limit)}
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


def train_reasoner(
    config: ReasonerRunConfig,
    out_dir: str | Path,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    stop_at: int | None = None,
) -> ReasonerTrainResult:
    """Train (or resume) the reasoner run in ``out_dir`` until ``train.steps`` batches or the time budget.

    ``stop_at`` ends this call after that many batches (as an interruption would), with a checkpoint.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    tc, arch = config.train, config.arch
    task = get_task(config.task.name, **config.task.options)
    config.model = fit_to_task(config.model, task)
    task, data = task_data(config, out)
    device = resolve_device(tc.device)

    _seed_everything(tc.seed)
    model = build_reasoner(arch, config.model).to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = build_optimizer(model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
    checkpoint = latest_checkpoint(out)
    start_step, examples_seen = 0, 0
    if checkpoint is not None:
        _check_architecture(checkpoint, model)
        model.load_weights(checkpoint / TRAIN_WEIGHTS)
        ema.load_weights(checkpoint / "model.safetensors")
        state, torch_rng = load_training_state(checkpoint, optimizer)
        start_step, examples_seen = state["step"], int(state.get("examples_seen", 0))
        restore_rng_state(state["rng"], torch_rng)
        if log:
            log(f"resuming from {checkpoint} (step {start_step})")
    save_run_config(config, out / "config.yaml")
    model.train()
    precision = _choose_precision(tc.precision, config.model, tc.batch_size * task.seq_len, device)
    autocast_device = "cuda" if device.startswith("cuda") else "cpu"
    n_sup = config.model.n_sup
    total_updates = tc.steps * n_sup
    params, ema_params = list(model.parameters()), list(ema.parameters())  # same order: ema is a deep copy

    metrics = _Metrics(out, start_step, tc.tensorboard)
    end_step = tc.steps if stop_at is None else min(tc.steps, stop_at)
    budget_s = tc.budget_minutes * 60 if tc.budget_minutes else math.inf
    losses: list[float] = []
    window: dict[str, float] = {}
    last_saved, saved_step = checkpoint, (start_step if checkpoint is not None else -1)
    stopped, step = "steps", start_step
    wrapped = _TrainingWeights(model, ema)
    bar = _ProgressBar(enabled=progress, total=tc.steps, completed=start_step)

    def trainer_state() -> dict[str, Any]:
        return {"examples_seen": examples_seen, "precision": precision, "seed": tc.seed, "arch": arch}

    last_eval: dict[str, Any] | None = None
    interrupt = _InterruptFlag()
    try:
        with bar, interrupt:
            while step < end_step:
                if interrupt.raised:
                    if step > saved_step:
                        save_checkpoint(out, step, wrapped, optimizer, trainer_state(), tc.keep_checkpoints)  # type: ignore[arg-type]
                    raise KeyboardInterrupt
                if time.perf_counter() - started >= budget_s:
                    stopped = "budget"
                    break
                tick = time.perf_counter()
                inputs, labels = train_batch(task, data["train"], step, tc.batch_size, tc.seed, tc.augment)
                inputs, labels = inputs.to(device), labels.to(device)
                batch = {"inputs": inputs}
                carry = model.initial_carry(batch)
                for n in range(n_sup):
                    update = step * n_sup + n
                    lr = lr_at(update, tc.lr, tc.warmup_steps, total_updates, tc.min_lr_ratio)
                    set_lr(optimizer, lr)
                    with torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        carry, output = model(carry, batch, target=labels)
                        loss, parts = supervision_loss(output, labels, config.model.beta, tc)
                    value = float(loss.detach())
                    if not math.isfinite(value):
                        raise TrainingError(
                            f"loss became {value} at step {step + 1}, supervision step {n + 1} (lr {lr:.3g}); "
                            f"last checkpoint: {last_saved or 'none'}; try a lower train.lr"
                        )
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        params, tc.grad_clip if tc.grad_clip > 0 else math.inf
                    )
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    with torch.no_grad():
                        torch._foreach_lerp_(ema_params, params, 1.0 - tc.ema)
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
                examples_seen += inputs.shape[0]
                bar.update(step, value, tc.batch_size / max(time.perf_counter() - tick, 1e-9))
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
                    last_eval = _evaluate(ema, task, data["test"], tc.eval_size, step, metrics, log)
                if tc.checkpoint_every and step % tc.checkpoint_every == 0:
                    last_saved = save_checkpoint(
                        out, step, wrapped, optimizer, trainer_state(), tc.keep_checkpoints
                    )  # type: ignore[arg-type]
                    saved_step = step
            if stop_at is not None and step >= stop_at and step < tc.steps:
                stopped = "stop_at"
    except BaseException:
        metrics.close()
        raise
    if step != saved_step:
        last_saved = save_checkpoint(out, step, wrapped, optimizer, trainer_state(), tc.keep_checkpoints)  # type: ignore[arg-type]
    if stopped != "stop_at" and tc.eval_size and (last_eval is None or last_eval["step"] != step):
        last_eval = _evaluate(ema, task, data["test"], tc.eval_size, step, metrics, log)
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
