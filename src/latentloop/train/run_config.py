"""Run configs: the ``arch``, ``model``, ``train`` and ``task`` sections of a run, loaded from YAML.

Configs are data. :class:`RunConfig` (the recurrent-depth LM) and :class:`ReasonerRunConfig` (the puzzle
reasoners) load from YAML and take ``key=value`` overrides such as ``model.n_embd=128 train.lr=1e-3
task.digits=3``; a run folder keeps its config as ``OUT/config.yaml``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from latentloop.config import apply_overrides, from_dict, load_yaml, save_yaml, to_dict
from latentloop.errors import UsageError
from latentloop.models.reasoners import REASONERS, ReasonerConfig
from latentloop.models.recurrent_depth import RecurrentDepthConfig
from latentloop.tasks.base import Task, parse_task_spec, task_class
from latentloop.train.curriculum import CurriculumStage, check_curriculum
from latentloop.train.recurrence import SCHEMES

# The values of train.parallel (latentloop.train.distributed wraps the model for each)
PARALLEL = ("ddp", "fsdp")

PRECISIONS = ("auto", "fp32", "bf16")
LM_ARCH = "recurrent-depth"


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping settings of a run."""

    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    # The share of the steps over which the rate decays (1: cosine after the warmup; less: held, then decayed)
    decay_fraction: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    grad_clip: float = 1.0
    batch_size: int = 64
    steps: int = 1000
    budget_minutes: float | None = None
    # With budget_minutes: time the first steps, then shorten train.steps to the schedule that fills the
    # budget at that speed (see latentloop.train.loop.fitted_steps), so the cosine and the curriculum end
    # with the budget on any machine. train.steps is then the most the run may take.
    fit_steps: bool = False
    seed: int = 0
    precision: str = "auto"
    # Compile every transformer block with torch.compile (fuses the elementwise work; costs a compile first).
    compile: bool = False
    # Threads of each compiled C++ kernel on a CPU; 0: every thread torch uses. 1: the compiled kernels round
    # the same at any thread count, as the matrix products outside them do in MKL's strict mode, which importing
    # latentloop sets (docs/training.md).
    compile_threads: int = 0
    device: str = "auto"
    init_scale: float = 1.0
    # Labels within reach (the recurrent-depth LM, a task that counts_label_work): a label whose work exceeds
    # work_per_iteration x the step's sampled depth is not scored that step, so no step asks for more than
    # its depth can carry out; held-out evaluation is unchanged. None: every label is scored.
    work_per_iteration: float | None = None
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
        if (
            isinstance(self.compile_threads, bool)
            or not isinstance(self.compile_threads, int)
            or (self.compile_threads < 0)
        ):
            raise UsageError(
                f"train.compile_threads must be a whole number of at least 0, got {self.compile_threads!r}"
            )
        if self.parallel not in PARALLEL:
            raise UsageError(f"train.parallel must be one of {', '.join(PARALLEL)}, got {self.parallel!r}")
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
        if not 0 < self.decay_fraction <= 1:
            raise UsageError(f"train.decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if not self.lr > 0:
            raise UsageError(f"train.lr must be positive, got {self.lr}")
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise UsageError(f"train.budget_minutes must be positive, got {self.budget_minutes}")
        if self.fit_steps and self.budget_minutes is None:
            raise UsageError("train.fit_steps needs train.budget_minutes (the time to fit the steps into)")
        if self.work_per_iteration is not None and not self.work_per_iteration > 0:
            raise UsageError(f"train.work_per_iteration must be positive, got {self.work_per_iteration}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise UsageError(f"train.betas must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise UsageError("train.grad_clip and train.weight_decay must not be negative")


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
    # Training puzzles held out into a validation split, on which the run's own evaluations (and an experiment
    # with eval.split: validation) are made, so settings are tuned without the test split; 0: none.
    validation: int = 0
    # Seed of the dataset (which puzzles are train, validation and test); None: train.seed. Fixing it compares
    # training seeds on the same test puzzles.
    data_seed: int | None = None
    data: str | None = None
    # A checkpoint (or run) folder whose weights a fresh run starts from, with a fresh optimizer: fine-tuning,
    # or continuing a converted official checkpoint (latentloop convert). Ignored once the run has its own.
    init_from: str | None = None
    # Cheaper deep supervision (see latentloop.train.curriculum): stages of (n_sup, cycles, inner) over the
    # run, and the decay of the supervision steps' loss weights (1: all alike).
    curriculum: list[CurriculumStage] = field(default_factory=list)
    step_weight_decay: float = 1.0
    # GRAM's samples on the prior's noise (model.prior_share) learn the puzzle's valid answer likeliest under
    # their own prediction instead of the one label they were drawn with (tasks that list every valid answer)
    nearest_target: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_curriculum(self.curriculum)
        if not 0 < self.step_weight_decay <= 1:
            raise UsageError(f"train.step_weight_decay must be in (0, 1], got {self.step_weight_decay}")
        if isinstance(self.validation, bool) or not isinstance(self.validation, int) or self.validation < 0:
            raise UsageError(
                f"train.validation must be a number of puzzles of at least 0, got {self.validation}"
            )
        if not 0 <= self.ema < 1:
            raise UsageError(f"train.ema must be in [0, 1), got {self.ema}")
        if not 0 <= self.halt_exploration <= 1:
            raise UsageError(f"train.halt_exploration must be in [0, 1], got {self.halt_exploration}")
        if self.parallel != "ddp":
            raise UsageError(
                f"train.parallel={self.parallel} is for the recurrent-depth LM; reasoners train with ddp"
            )
        if self.work_per_iteration is not None:
            raise UsageError("train.work_per_iteration is for the recurrent-depth LM, not the reasoners")


@dataclass
class TaskConfig:
    """A task name and its options (in YAML written flat: ``task: {name: arithmetic, digits: 3}``)."""

    name: str = "arithmetic"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunConfig:
    """A recurrent-depth LM run: the architecture name and the ``model``, ``train`` and ``task`` sections."""

    arch: str = LM_ARCH
    model: RecurrentDepthConfig = field(default_factory=RecurrentDepthConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    archs = (LM_ARCH,)

    def validate(self) -> None:
        """Checks that span fields (or need the depth-sampling schemes); raises :class:`UsageError`."""
        if self.model.sampling_scheme not in SCHEMES:
            raise UsageError(
                f"model.sampling_scheme must be one of {', '.join(SCHEMES)}, got {self.model.sampling_scheme!r}"
            )


@dataclass
class ReasonerRunConfig:
    """A reasoner run: ``arch`` (a name of ``REASONERS``) and the ``model``, ``train``, ``task`` sections."""

    arch: str = "gram"
    model: ReasonerConfig = field(default_factory=ReasonerConfig)
    train: ReasonerTrainConfig = field(default_factory=ReasonerTrainConfig)
    task: TaskConfig = field(default_factory=lambda: TaskConfig(name="nqueens"))

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted(REASONERS))

    def validate(self) -> None:
        """Nothing beyond the sections' own checks."""


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
) -> Any:
    """A run config (``config_cls``: :class:`RunConfig` or :class:`ReasonerRunConfig`) from a YAML-style
    mapping, then ``task`` (a spec such as ``"arithmetic:digits=4"``) and ``arch``, then ``key=value``
    overrides. A task given by name drops the options of a different task."""
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
    if config.arch not in config.archs:
        raise UsageError(f"unknown model {config.arch!r} (known: {', '.join(config.archs)})")
    config.validate()
    _check_task(config.task)
    return config


def build_reasoner_config(
    data: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    task: str | None = None,
    arch: str | None = None,
) -> ReasonerRunConfig:
    """A :class:`ReasonerRunConfig` from YAML-style data, a task spec, an arch and ``key=value`` overrides."""
    data = dict(data or {})
    data.setdefault("task", {"name": "nqueens"})
    return build_run_config(data, overrides, task=task, arch=arch, config_cls=ReasonerRunConfig)


def run_config_to_dict(config: RunConfig | ReasonerRunConfig) -> dict[str, Any]:
    """The YAML form of a run config (task options written flat beside ``name``)."""
    data = to_dict(config)
    data["task"] = {"name": config.task.name, **config.task.options}
    data["train"]["betas"] = list(config.train.betas)
    return data


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a recurrent-depth LM run config (e.g. ``OUT/config.yaml``) and apply ``overrides``."""
    return build_run_config(load_yaml(path), overrides)


def load_reasoner_run_config(path: str | Path) -> ReasonerRunConfig:
    """Read a reasoner run config (e.g. ``OUT/config.yaml``)."""
    return build_reasoner_config(load_yaml(path))


def save_run_config(config: RunConfig | ReasonerRunConfig, path: str | Path) -> None:
    """Write ``config`` as YAML, atomically."""
    save_yaml(run_config_to_dict(config), path)


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
    fitted.__post_init__()  # the checks that depend on the sizes just filled in (model.rope_grid)
    return fitted
