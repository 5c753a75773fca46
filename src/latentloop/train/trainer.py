"""Training loop for recurrent-depth language models.

One optimizer step: the batch of the step (a pure function of ``(seed, step)``), the recurrence depth of the
step (a pure function of ``(seed, step)``, see :mod:`latentloop.train.recurrence`), the learning rate of the
step (warmup + cosine, a pure function of the step), forward with truncated backpropagation, gradient clipping,
AdamW. Because nothing but the weights, the optimizer moments and the torch RNG (which draws the random initial
state) carries over between steps, a run resumed from a checkpoint reproduces the uninterrupted run's losses
exactly on the same machine.

Under ``torchrun`` the same loop runs data-parallel (see :mod:`latentloop.train.distributed`): every rank builds
the step's global batch and keeps its slice, the initial latent state is drawn for the global batch and sliced,
and each rank's loss is weighted by its share of the global batch's scored tokens, so the averaged gradient
(and the logged loss) equals the single-process one up to float rounding. ``train.parallel`` picks how:
``ddp`` replicates the model on every rank, ``fsdp`` shards each transformer block (prelude, recurrent core,
coda) and the rest of the model over the ranks (FSDP2) for models too large for one device; checkpoints are
the same single-file layout either way.

Configs are data: :class:`RunConfig` has sections ``model`` (:class:`RecurrentDepthConfig`), ``train``
(:class:`TrainConfig`) and ``task`` (a name plus the task's options), loads from YAML and takes ``key=value``
overrides such as ``model.n_embd=128 train.lr=1e-3 task.digits=3``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from latentloop.config import apply_overrides, from_dict, load_yaml, save_yaml, to_dict
from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.nn import compile_blocks
from latentloop.runtime import settle_vector_math
from latentloop.tasks.base import get_task, task_class
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
from latentloop.train.recurrence import SCHEMES, sampler_for

PRECISIONS = ("auto", "fp32", "bf16")
ARCHS = ("recurrent-depth",)


class TrainingError(RuntimeError):
    """Training cannot continue (e.g. the loss became NaN); the message names the step."""


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping settings of a run."""

    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    grad_clip: float = 1.0
    batch_size: int = 64
    steps: int = 1000
    budget_minutes: float | None = None
    seed: int = 0
    precision: str = "auto"
    # Compile every transformer block with torch.compile (fuses the elementwise work; costs a compile first).
    compile: bool = False
    device: str = "auto"
    init_scale: float = 1.0
    log_every: int = 10
    eval_every: int = 250
    eval_size: int = 256
    eval_batch_size: int = 256
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    tensorboard: bool = True
    # With several processes: ddp (a replica of the model per rank) or fsdp (sharded); one process ignores it.
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        if self.parallel not in dist.PARALLEL:
            raise UsageError(
                f"train.parallel must be one of {', '.join(dist.PARALLEL)}, got {self.parallel!r}"
            )
        if self.precision not in PRECISIONS:
            raise UsageError(
                f"train.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UsageError(f"train.device must be auto, cpu or cuda[:N], got {self.device!r}")
        for name in ("batch_size", "log_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"train.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("steps", "warmup_steps", "eval_every", "eval_size", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise UsageError(f"train.{name} must not be negative, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UsageError(f"train.lr must be positive, got {self.lr}")
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise UsageError(f"train.budget_minutes must be positive, got {self.budget_minutes}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UsageError(f"train.betas must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise UsageError("train.grad_clip and train.weight_decay must not be negative")


@dataclass
class TaskConfig:
    """A task name and its options (in YAML written flat: ``task: {name: arithmetic, digits: 3}``)."""

    name: str = "arithmetic"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunConfig:
    """Everything a run needs: the architecture name and the ``model``, ``train`` and ``task`` sections."""

    arch: str = "recurrent-depth"
    model: RecurrentDepthConfig = field(default_factory=RecurrentDepthConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task: TaskConfig = field(default_factory=TaskConfig)


# Config assembly ---------------------------------------------------------------------------------------------
def _check_task(task: TaskConfig) -> None:
    """Unknown task names and options fail here, before any work starts."""
    cls = task_class(task.name)
    try:
        inspect.signature(cls.__init__).bind(None, **task.options)
    except TypeError as error:
        known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        raise UsageError(f"task {task.name!r}: {error} (options: {', '.join(known)})") from None


def _parse_value(text: str) -> Any:
    """A command-line task option: YAML scalars become numbers/booleans, lists need brackets (so ``ops=-``
    stays the string ``"-"`` rather than YAML's one-item list)."""
    try:
        value = yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text
    if isinstance(value, (list, dict)) and not text.strip().startswith(("[", "{")):
        return text
    return text if value is None else value


def build_run_config(
    data: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    task: str | None = None,
    arch: str | None = None,
    config_cls: type = RunConfig,
    archs: Sequence[str] = ARCHS,
) -> Any:
    """A :class:`RunConfig` from a YAML-style mapping, then ``task`` (a spec such as ``"arithmetic:digits=4"``)
    and ``arch``, then ``key=value`` overrides. A task given by name drops the options of a different task.
    ``config_cls``/``archs`` let other model families (the puzzle reasoners) build their run configs the same way."""
    from latentloop.tasks.base import parse_task_spec

    data = copy.deepcopy(dict(data or {}))
    section = data.pop("task", None) or {}
    if isinstance(section, str):
        task_name, options = parse_task_spec(section)
    elif isinstance(section, dict):
        section = dict(section)
        task_name = str(section.pop("name", "arithmetic"))
        options = dict(section.pop("options", None) or {})
        options.update(section)
    else:
        raise UsageError(f"config: task must be a name or a mapping, got {section!r}")
    if task:
        name, spec_options = parse_task_spec(task)
        if name != task_name:
            options = {}
        task_name = name
        options.update({k: _parse_value(v) for k, v in spec_options.items()})
    if arch:
        data["arch"] = arch
    rest: list[str] = []
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"override {item!r} is not of the form key=value")
        key = key.strip()
        if key == "task.name":
            if value.strip() != task_name:
                options = {}
            task_name = value.strip()
        elif key.startswith("task."):
            options[key[len("task.") :].replace("-", "_")] = _parse_value(value)
        else:
            rest.append(item)
    data["task"] = {"name": task_name, "options": options}
    config = from_dict(config_cls, data)
    if rest:
        config = apply_overrides(config, rest)
    if config.arch not in archs:
        raise UsageError(f"unknown model {config.arch!r} (known: {', '.join(archs)})")
    if hasattr(config.model, "sampling_scheme") and config.model.sampling_scheme not in SCHEMES:
        raise UsageError(
            f"model.sampling_scheme must be one of {', '.join(SCHEMES)}, got {config.model.sampling_scheme!r}"
        )
    _check_task(config.task)
    return config


def run_config_to_dict(config: RunConfig) -> dict[str, Any]:
    """The YAML form of a run config (task options written flat beside ``name``)."""
    data = to_dict(config)
    data["task"] = {"name": config.task.name, **config.task.options}
    data["train"]["betas"] = list(config.train.betas)
    return data


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a run config YAML file (e.g. ``OUT/config.yaml``) and apply ``overrides``."""
    return build_run_config(load_yaml(path), overrides)


def save_run_config(config: RunConfig, path: str | Path) -> None:
    """Write ``config`` as YAML, atomically."""
    save_yaml(run_config_to_dict(config), path)


# Precision ---------------------------------------------------------------------------------------------------
def _time_matmul(x: torch.Tensor, w: torch.Tensor, bf16: bool, repeats: int) -> float:
    device = x.device.type
    best = math.inf
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        for i in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            _ = x @ w
            if device == "cuda":
                torch.cuda.synchronize()
            if i:  # the first call warms up kernels and caches
                best = min(best, time.perf_counter() - start)
    return best


def measure_matmul_speed(
    rows: int, dim: int, hidden: int, device: str = "cpu", repeats: int = 5
) -> dict[str, float]:
    """Seconds for a ``[rows, dim] @ [dim, hidden]`` matmul in fp32 and under bf16 autocast (best of
    ``repeats``); inputs come from a private generator so the global torch RNG is untouched."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=generator).to(device)
    w = torch.randn(dim, hidden, generator=generator).to(device)
    return {
        "fp32": _time_matmul(x, w, False, repeats),
        "bf16": _time_matmul(x, w, True, repeats),
    }


def choose_precision(requested: str, model_config: RecurrentDepthConfig, tokens: int, device: str) -> str:
    """``fp32`` or ``bf16``. ``auto`` measures a matmul the size of the model's MLP at this batch: bf16 is
    picked only when it is clearly (>10%) faster, since CPUs without native bf16 units run it several times
    slower than fp32."""
    if requested != "auto":
        return requested
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    timing = measure_matmul_speed(
        min(tokens, 4096), model_config.n_embd, 2 * model_config.intermediate_size, device
    )
    return "bf16" if timing["bf16"] < 0.9 * timing["fp32"] else "fp32"


def resumed_precision(requested: str, saved_state: Mapping[str, Any] | None) -> str:
    """``requested``, except that ``auto`` resumes with the precision the run's checkpoint was trained in
    (timing again could switch precision mid-run)."""
    saved = saved_state.get("precision") if saved_state is not None else None
    return saved if requested == "auto" and saved in ("fp32", "bf16") else requested


def resolve_device(requested: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"train.device is {requested!r}, but no CUDA device is available")
    return requested


def compile_for_training(model: torch.nn.Module, device: str) -> None:
    """``train.compile``: compile the model's blocks in place (:func:`latentloop.nn.compile_blocks`). On a
    CPU the compiler builds C++ kernels, so a missing C++ compiler is reported here, before training starts,
    rather than as a traceback at the first step."""
    if not device.startswith("cuda"):
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as error:
            raise UsageError(
                "train.compile on a CPU needs a C++ compiler (g++ or clang++, or one named by $CXX); none was "
                "found: install one or drop train.compile"
            ) from error
    compile_blocks(model)


# Training ----------------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What a call to :func:`train` did."""

    out_dir: Path
    step: int
    losses: list[float]
    checkpoint: Path | None
    stopped: str
    tokens_seen: int
    precision: str
    elapsed_s: float
    resumed_from: int
    last_eval: dict[str, Any] | None = None


class _Metrics:
    """Appends JSON lines to ``metrics.jsonl`` (and TensorBoard scalars when tensorboard is importable).
    Disabled (``enabled=False``, ranks other than 0) it writes nothing."""

    def __init__(self, out_dir: Path, resume_step: int, tensorboard: bool, enabled: bool = True) -> None:
        self.path = out_dir / "metrics.jsonl"
        self.stream: Any = None
        self.writer: Any = None
        if not enabled:
            return
        if self.path.exists():
            # Records past the checkpoint we resume from belong to a run that died later: drop them.
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    continue
            from latentloop.io import atomic_write_text

            atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))
        self.stream = self.path.open("a")
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self.writer = None

    def write(self, record: dict[str, Any]) -> None:
        if self.stream is None:
            return
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()
        if self.writer is not None:
            prefix = "eval" if record.get("kind") == "eval" else "train"
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.writer.add_scalar(f"{prefix}/{key}", value, record["step"])

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        if self.writer is not None:
            self.writer.close()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _check_fit(config: RunConfig, task: Any) -> None:
    if config.model.vocab_size < task.vocab_size:
        raise UsageError(
            f"model.vocab_size {config.model.vocab_size} is smaller than the task's vocabulary "
            f"({task.vocab_size}); set model.vocab_size={task.vocab_size} or more"
        )
    if config.model.block_size < task.seq_len:
        raise UsageError(
            f"model.block_size {config.model.block_size} is shorter than the task's sequences ({task.seq_len})"
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


def train(
    config: RunConfig,
    out_dir: str | Path,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    stop_at: int | None = None,
) -> TrainResult:
    """Train (or resume) the run in ``out_dir`` until ``train.steps`` or ``train.budget_minutes``.

    Resumes from the newest complete checkpoint of ``out_dir`` when there is one. ``progress`` shows a rich
    progress bar; ``log`` receives one text line per logged step (for non-interactive output). ``stop_at``
    ends this call after that many completed steps (as an interruption would), with a checkpoint, without
    changing the schedule. Raises :class:`TrainingError` when the loss stops being finite.

    Launched by ``torchrun`` (``WORLD_SIZE > 1``) it trains data-parallel; only rank 0 writes to ``out_dir``
    and logs, and every rank returns the same result.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    tc = config.train
    task = get_task(config.task.name, **config.task.options)
    if not hasattr(task, "train_batch"):
        raise UsageError(f"task {config.task.name!r} cannot train a language model")
    _check_fit(config, task)
    settle_vector_math()
    ctx, device = dist.setup(resolve_device(tc.device))
    try:
        dist.check_batch(tc.batch_size, ctx)
        return _train(config, out, task, ctx, device, started, progress, log, stop_at)
    finally:
        dist.shutdown(ctx)


def _train(
    config: RunConfig,
    out: Path,
    task: Any,
    ctx: dist.DistContext,
    device: str,
    started: float,
    progress: bool,
    log: Callable[[str], None] | None,
    stop_at: int | None,
) -> TrainResult:
    tc = config.train
    if not ctx.is_main:
        progress, log = False, None
    out.mkdir(parents=True, exist_ok=True)
    _seed_everything(tc.seed)
    # Rank 0 picks the checkpoint, so that all ranks resume from the same one.
    found = dist.broadcast_object(str(latest_checkpoint(out) or ""), ctx)
    checkpoint = Path(found) if found else None
    sharded = ctx.enabled and tc.parallel == "fsdp"
    if checkpoint is not None:
        model = _load_model_from(checkpoint, config.model)
    else:
        model = RecurrentDepthLM(config.model)
    if not sharded:  # FSDP moves only each rank's shard to the device
        model = model.to(device)
    model.train()
    if tc.compile:
        compile_for_training(model, device)
    optimizer = build_optimizer(model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
    tokens_per_step = tc.batch_size * task.seq_len
    start_step, tokens_seen, state = 0, 0, None
    if checkpoint is not None:
        # Under FSDP this optimizer, over the still unsharded model, only reads and checks the full saved
        # state, which is then split into the sharded optimizer's shards below.
        state, torch_rng = load_training_state(checkpoint, optimizer)
        start_step, tokens_seen = state["step"], int(state.get("tokens_seen", 0))
        # The time budget covers the whole run, interrupted or not.
        started -= float(state.get("train_seconds", 0.0))
        restore_training_rng(state, torch_rng, ctx.rank, ctx.world_size)
        if log:
            log(f"resuming from {checkpoint} (step {start_step})")
    # "auto" times matmuls, which may come out differently on each rank; rank 0's choice holds for all,
    # and a resumed run keeps the choice it made when it started.
    precision = dist.broadcast_object(
        choose_precision(resumed_precision(tc.precision, state), config.model, tokens_per_step, device), ctx
    )
    if sharded:
        full_optimizer_state = optimizer.state_dict()
        blocks = [*model.transformer.prelude, *model.transformer.core_block, *model.transformer.coda]
        forward = model = dist.fully_shard_model(model, blocks, ctx, device)
        optimizer = build_optimizer(model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
        if checkpoint is not None:
            dist.load_full_optimizer_state(model, optimizer, full_optimizer_state)
        del full_optimizer_state
    else:
        forward = dist.wrap(model, ctx, device)
    if ctx.is_main:
        save_run_config(config, out / "config.yaml")

    sampler = sampler_for(config.model, tc.seed)
    metrics = _Metrics(out, start_step, tc.tensorboard, enabled=ctx.is_main)
    end_step = tc.steps if stop_at is None else min(tc.steps, stop_at)
    budget_s = tc.budget_minutes * 60 if tc.budget_minutes else math.inf
    autocast_device = "cuda" if device.startswith("cuda") else "cpu"
    losses: list[float] = []
    window: dict[str, float] = {"loss": 0.0, "depth": 0.0, "grad": 0.0, "n": 0, "tokens": 0, "time": 0.0}
    last_eval: dict[str, Any] | None = None
    last_saved: Path | None = checkpoint
    saved_step = start_step if checkpoint is not None else -1
    stopped = "steps"
    step = start_step
    bar = _ProgressBar(progress, tc.steps, start_step, budget_s=budget_s, started=started)

    def save(at: int) -> Path:
        # Every rank hands its RNG states to rank 0, which alone writes the checkpoint.
        rank_rng = dist.gather_objects(capture_rank_rng(), ctx)
        path = out / "checkpoints" / checkpoint_name(at)
        saved_model, saved_optimizer = model, optimizer
        if sharded:
            model_state, optimizer_state = dist.gather_full_state(model, optimizer, ctx)
            if ctx.is_main:
                saved_model, saved_optimizer = _unsharded_copy(config, model_state, optimizer_state)
            del model_state, optimizer_state
        if ctx.is_main:
            state = {
                "tokens_seen": tokens_seen,
                "train_seconds": time.perf_counter() - started,
                "precision": precision,
                "seed": tc.seed,
                "task": config.task.name,
                "world_size": ctx.world_size,
                "parallel": tc.parallel if ctx.enabled else "none",
            }
            path = save_checkpoint(
                out, at, saved_model, saved_optimizer, state, tc.keep_checkpoints, rank_rng=rank_rng
            )
        dist.barrier(ctx)
        return path

    interrupt = _InterruptFlag()
    try:
        with bar, interrupt:
            while step < end_step:
                unsaved = functools.partial(save, step) if step > saved_step else None
                if interrupt.should_stop(ctx, started, budget_s, checkpoint=unsaved):
                    stopped = "budget"
                    break
                tick = time.perf_counter()
                lr = lr_at(step, tc.lr, tc.warmup_steps, tc.steps, tc.min_lr_ratio)
                set_lr(optimizer, lr)
                batch_inputs, batch_labels = task.train_batch(step, tc.batch_size, tc.seed)
                init_state = _initial_state(model, batch_inputs.shape, tc.init_scale, device)
                inputs = dist.shard(batch_inputs, ctx).to(device)
                labels = dist.shard(batch_labels, ctx).to(device)
                if init_state is not None:
                    init_state = dist.shard(init_state, ctx)
                no_grad, with_grad = sampler(step)
                with torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    output = forward(
                        inputs,
                        num_steps=(no_grad, with_grad),
                        init_scale=tc.init_scale,
                        labels=labels,
                        input_states=init_state,
                    )
                loss = output.loss
                if ctx.enabled:
                    # The loss is a mean over scored tokens, which shards hold in different numbers: weight each
                    # shard by its share, so the mean over ranks (what DDP does to gradients) is the global mean.
                    scored = int((labels != -100).sum())
                    share = scored / max(int((batch_labels != -100).sum()), 1)
                    if scored == 0:  # keep the graph (DDP expects every rank's gradients) without a 0/0
                        loss = output.logits.float().sum() * 0.0
                    (loss_value,) = dist.all_reduce_sum([float(loss.detach()) * share], ctx)
                    loss = loss * (share * ctx.world_size)
                else:
                    loss_value = float(loss.detach())
                if not math.isfinite(loss_value):
                    raise TrainingError(
                        f"loss became {loss_value} at step {step + 1} (lr {lr:.3g}, depth {no_grad + with_grad}); "
                        f"last checkpoint: {last_saved or 'none'}; try a lower train.lr"
                    )
                loss.backward()
                # Under FSDP the parameters are shards (DTensors) and this is the norm over all of them.
                grad_norm = dist.full_value(
                    torch.nn.utils.clip_grad_norm_(
                        model.parameters(), tc.grad_clip if tc.grad_clip > 0 else math.inf
                    )
                )
                if not torch.isfinite(grad_norm):
                    raise TrainingError(
                        f"gradient norm became {float(grad_norm)} at step {step + 1}; "
                        f"last checkpoint: {last_saved or 'none'}; try a lower train.lr"
                    )
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                tokens_seen += batch_inputs.numel()
                losses.append(loss_value)
                elapsed_step = time.perf_counter() - tick
                for key, value in (
                    ("loss", loss_value),
                    ("depth", no_grad + with_grad),
                    ("grad", float(grad_norm)),
                    ("n", 1),
                    ("tokens", batch_inputs.numel()),
                    ("time", elapsed_step),
                ):
                    window[key] += value
                bar.update(step, loss_value, window["tokens"] / max(window["time"], 1e-9))

                if step % tc.log_every == 0 or step == end_step:
                    n = window["n"]
                    record = {
                        "kind": "train",
                        "step": step,
                        "loss": window["loss"] / n,
                        "lr": lr,
                        "depth": window["depth"] / n,
                        "grad_norm": window["grad"] / n,
                        "tokens_seen": tokens_seen,
                        "tokens_per_s": window["tokens"] / max(window["time"], 1e-9),
                        "elapsed_s": round(time.perf_counter() - started, 3),
                    }
                    metrics.write(record)
                    if log:
                        log(
                            f"step {step:>6}  loss {record['loss']:.4f}  lr {lr:.2e}  depth {record['depth']:.1f}"
                            f"  {record['tokens_per_s']:.0f} tok/s"
                        )
                    window = dict.fromkeys(window, 0.0)
                if tc.eval_every and step % tc.eval_every == 0:
                    last_eval = _quick_eval(
                        model, task, config, step, precision, autocast_device, ctx, split=not sharded
                    )
                    metrics.write(last_eval)
                    if log:
                        log(_format_eval(last_eval))
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
    if stopped != "stop_at" and (last_eval is None or last_eval["step"] != step) and tc.eval_size:
        last_eval = _quick_eval(model, task, config, step, precision, autocast_device, ctx, split=not sharded)
        metrics.write(last_eval)
        if log:
            log(_format_eval(last_eval))
    metrics.close()
    return TrainResult(
        out_dir=out,
        step=step,
        losses=losses,
        checkpoint=last_saved,
        stopped=stopped,
        tokens_seen=tokens_seen,
        precision=precision,
        elapsed_s=time.perf_counter() - started,
        resumed_from=start_step,
        last_eval=last_eval,
    )


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


def _quick_eval(
    model: RecurrentDepthLM,
    task: Any,
    config: RunConfig,
    step: int,
    precision: str,
    device: str,
    ctx: dist.DistContext = dist.SINGLE,
    split: bool = True,
) -> dict[str, Any]:
    """Held-out metric at the mean training depth on ``train.eval_size`` examples (deterministic: zero init).
    With several processes each rank evaluates its share of the batches and the counts are summed; with
    ``split=False`` (a sharded model, whose every forward is a collective that all ranks must join) every
    rank evaluates all batches."""
    from latentloop.eval.lm import heldout_metric

    split = split and ctx.enabled

    depth = config.model.mean_recurrence
    was_training = model.training
    model.eval()
    shard = _RankBatches(task, ctx) if split else task
    value: dict[str, Any] | None
    try:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
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


def _format_eval(record: dict[str, Any]) -> str:
    metric = "exact_match" if "exact_match" in record else "perplexity"
    return f"eval step {record['step']}: {metric} {record[metric]:.4f} at depth {record['num_steps']}"


class _InterruptFlag:
    """While active (main thread only), the first Ctrl-C or SIGTERM (e.g. a preempted job) sets ``raised``
    instead of interrupting mid-update; the loop then checkpoints and stops. A second signal acts at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.raised = False
        self.previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self.raised = True
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    def __enter__(self) -> _InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self.previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def should_stop(
        self, ctx: dist.DistContext, started: float, budget_s: float, checkpoint: Callable[[], Any] | None
    ) -> bool:
        """Called between steps: on a signal (seen by any rank) run ``checkpoint`` (None when the state is
        saved already) and raise KeyboardInterrupt; return True once the time budget since ``started`` is
        spent. All ranks must stop at the same step, so the decision is shared."""
        interrupted, over_budget = dist.any_rank(
            [self.raised, time.perf_counter() - started >= budget_s], ctx
        )
        if interrupted:
            if checkpoint is not None:  # between steps, so the checkpoint holds a consistent state
                checkpoint()
            raise KeyboardInterrupt
        return bool(over_budget)


class _ProgressBar:
    """A rich progress bar: the phase, steps done, loss, the latest held-out accuracy, throughput and the time
    left (the sooner of the steps' ETA and the end of the time budget); nothing when disabled."""

    def __init__(
        self,
        enabled: bool,
        total: int,
        completed: int,
        phase: str = "train",
        unit: str = "tok/s",
        budget_s: float = math.inf,
        started: float | None = None,
    ) -> None:
        self.enabled, self.total, self.budget_s = enabled, total, budget_s
        self.started = time.perf_counter() if started is None else started
        self.first_step, self.first_time = completed, time.perf_counter()
        self.progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]:.4f}"),
                TextColumn("{task.fields[accuracy]}"),
                TextColumn(f"{{task.fields[rate]:.1f}} {unit}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[left]}"),
                console=Console(file=sys.stderr),
            )
            self.task = self.progress.add_task(
                phase, total=total, completed=completed, loss=float("nan"), accuracy="", rate=0.0, left=""
            )

    def __enter__(self) -> _ProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def seconds_left(self, step: int) -> float:
        """The sooner of the remaining steps at this run's pace and the remaining budget."""
        now = time.perf_counter()
        done = step - self.first_step
        by_steps = (self.total - step) * (now - self.first_time) / done if done > 0 else math.inf
        return max(0.0, min(by_steps, self.budget_s - (now - self.started)))

    def update(self, step: int, loss: float, rate: float, accuracy: float | None = None) -> None:
        if self.progress is None:
            return
        left = self.seconds_left(step)
        fields: dict[str, Any] = {"loss": loss, "rate": rate}
        fields["left"] = f"{int(left // 60)}:{int(left % 60):02d} left" if math.isfinite(left) else ""
        if accuracy is not None:
            fields["accuracy"] = f"acc {accuracy:.1%}"
        self.progress.update(self.task, completed=step, **fields)
