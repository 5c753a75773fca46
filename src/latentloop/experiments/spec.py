"""Experiment files: the spec dataclasses, the shipped experiments, and loading one with its overrides.

See :mod:`latentloop.experiments` for the file format.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latentloop.config import apply_overrides, load_yaml
from latentloop.errors import UsageError
from latentloop.eval.grid import GRID_FIELDS, ComputeGrid
from latentloop.experiments.kinds import DEFAULT_KIND, KINDS
from latentloop.paths import EXPERIMENTS_DIR  # shipped in the package: configs/experiments/

DEFAULT_EXPERIMENT = "default"
# The machine the shipped experiments' expected minutes (``expected_minutes``, and each model's
# ``reference_minutes``) were measured on. Their numbers do not depend on it: every schedule is fixed.
REFERENCE_MACHINE = (
    "2 cores of an AMD EPYC server CPU with AVX-512 and bf16 (AVX512_BF16), PyTorch 2.13.0 (CPU)"
)
# The metrics an experiment's ``targets`` may name (percent), each first reached at some checkpoint.
TARGET_METRICS = ("accuracy", "coverage")


@dataclass
class ModelSpec:
    """One row of an experiment: a run config and overrides applied on top of it."""

    name: str
    config: Path
    overrides: list[str] = field(default_factory=list)
    # Its training minutes on the reference machine (REFERENCE_MACHINE), as the experiment runs it (side by
    # side with others where jobs > 1): what this machine's measured pace is compared with.
    reference_minutes: float | None = None
    # ``key=value`` changes of the experiment's evaluation for this model alone (its own ``eval.*`` overrides,
    # without the prefix): an MDLM's unmasking steps, a generator's sampling depth and temperature.
    eval_overrides: list[str] = field(default_factory=list)


@dataclass
class EvalSpec:
    """How every model of an experiment is evaluated. Each kind reads its own settings (:data:`KIND_EVAL` names
    them, and an experiment of that kind may set no others); the file format keeps them in one flat ``eval:``
    mapping."""

    # Puzzle reasoners (kinds reasoners, time-to-accuracy; generation: samples and temperature)
    samples: int = 20
    steps: int = 16
    limit: int | None = None  # also language models': problems per depth
    select: str = "vote"
    seed: int = 0  # of the models' sampling noise: a rerun evaluates alike
    temperature: float = 1.0  # AR and MDLM: of their token draws; GRAM: scale of its prior noise
    # GRAM: updates of a value head fitted to its own samples before evaluating (latentloop fit-value); 0: off
    fit_value: int = 0
    # Recurrent-depth language models (kind lm): the test-time depths
    depths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    # Held-out tiers, name -> task options laid over the run's (``{test_hops: 9-16}``); one table row each.
    # Empty: the run's own held-out split.
    tiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A depth x width grid on one tier, ``{tier, widths, compute, init_scale, limit}``: accuracy of the majority
    # answer of K latent trajectories at depth r, for every r in depths and K in widths with r * K <= compute.
    # Empty: no grid.
    width: dict[str, Any] = field(default_factory=dict)
    # Checkpoint curves (kind time-to-accuracy): a checkpoint (and its evaluation) every this many batches
    every: int = 250
    # Puzzle models: "validation" evaluates on training puzzles held out by train.validation, for tuning
    split: str = "test"
    # Puzzle models' test-time compute (latentloop.eval.grid.ComputeGrid): accuracy, inference FLOPs and ms per
    # puzzle at each depth of steps_grid (one trajectory) and at each width depth x samples_grid (vote, value,
    # q); state_noise > 0 perturbs a deterministic model's state for its widths (noisy TRM). Empty: none.
    steps_grid: list[int] = field(default_factory=list)
    samples_grid: list[int] = field(default_factory=list)
    width_depths: list[int] = field(default_factory=list)
    state_noise: float = 0.0
    timing_puzzles: int = 8  # puzzles solved one at a time to time each cell


@dataclass
class Experiment:
    """A parsed experiment file."""

    name: str
    path: Path
    description: str
    models: list[ModelSpec]
    eval: EvalSpec
    paper: dict[str, dict[str, float]]
    paper_note: str = ""
    # Minutes of the whole run (training and evaluation) on the reference machine (REFERENCE_MACHINE)
    expected_minutes: float | None = None
    # A wall-clock cap on each model's training, in minutes; None: every model trains its whole schedule.
    # Shipped experiments set none: their numbers come from fixed schedules, the same on every machine.
    budget_minutes: float | None = None
    # What is trained, measured and reported: a name of latentloop.experiments.kinds.KINDS
    kind: str = DEFAULT_KIND
    overrides: list[str] = field(default_factory=list)  # given for this run (see load_experiment)
    targets: dict[str, float] = field(default_factory=dict)  # time-to-accuracy: metric -> percent
    jobs: int = 1  # models trained and evaluated at once, each in its own process
    # Torch threads of each model. Where compiled kernels use every thread (train.compile_threads 0) the count
    # decides how their reductions are split, and so the float rounding: a shipped experiment fixes it, so that
    # its numbers are the same bit for bit on a machine with more or fewer cores (given the same CPU kind and
    # torch build). None: an equal share of this machine's threads.
    threads_per_model: int | None = None
    # The share of every model's schedule trained (see latentloop.experiments.training.scale_schedules): 1 is
    # the experiment itself; less checks that its claims hold with a margin.
    schedule_fraction: float = 1.0

    def eval_for(self, spec: ModelSpec) -> EvalSpec:
        """How ``spec`` is evaluated: the experiment's evaluation with the model's own ``eval.*`` overrides,
        then this run's (:attr:`overrides`), which win."""
        if not spec.eval_overrides:
            return self.eval
        own = apply_overrides(self.eval, self._eval_overrides(spec))
        own.width = _parse_width(own.width, own.tiers, self.path)
        return own

    def evaluation_sets(self, spec: ModelSpec, key: str) -> bool:
        """Whether ``spec``'s own overrides or this run's set ``eval.key``."""
        return any(item.split("=", 1)[0].strip() == key for item in self._eval_overrides(spec))

    def _eval_overrides(self, spec: ModelSpec) -> list[str]:
        """The ``eval.*`` overrides of ``spec`` (without the prefix), its own first, then this run's."""
        return [*spec.eval_overrides, *_split_overrides(self.overrides)[1]]


def available_experiments(folder: Path = EXPERIMENTS_DIR) -> list[str]:
    """Names of the shipped experiments."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def positive_number(value: Any, name: str) -> float:
    """``value`` as a float; a one-line error naming ``name`` unless it is a finite positive number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise UsageError(f"{name} must be a positive number, got {value!r}")
    return number


OVERRIDE_SECTIONS = ("model", "train", "task", "eval")


def _parse_targets(raw: Any, path: Path) -> dict[str, float]:
    """The ``targets`` mapping of an experiment file (metric name -> percent in ``(0, 100]``), validated with
    one-line errors."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: targets must map metrics ({', '.join(TARGET_METRICS)}) to percents")
    targets = {}
    for metric, value in raw.items():
        if metric not in TARGET_METRICS:
            raise UsageError(f"{path}: targets.{metric} is not a metric (known: {', '.join(TARGET_METRICS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 100:
            raise UsageError(f"{path}: targets.{metric} must be a percent in (0, 100], got {value!r}")
        targets[str(metric)] = float(value)
    return targets


def _check_tiers(tiers: Any, path: Path) -> None:
    """A one-line error unless ``eval.tiers`` maps names to mappings of task options."""
    if not isinstance(tiers, dict) or not all(
        isinstance(name, str) and isinstance(options, dict) for name, options in tiers.items()
    ):
        raise UsageError(
            f"{path}: eval.tiers must map tier names to task options, e.g. {{hard: {{test_hops: 9-16}}}}"
        )


WIDTH_KEYS = {"tier": None, "widths": [1, 2, 4, 8, 16], "compute": 128, "init_scale": 1.0, "limit": None}


def _parse_width(raw: Any, tiers: dict[str, Any], path: Path) -> dict[str, Any]:
    """``eval.width`` with its defaults filled in (``{}`` stays ``{}``: no grid); one-line errors."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict) or set(raw) - set(WIDTH_KEYS):
        raise UsageError(f"{path}: eval.width takes only the keys {', '.join(WIDTH_KEYS)}")
    width = {**WIDTH_KEYS, **raw}
    if width["tier"] is not None and width["tier"] not in tiers:
        raise UsageError(f"{path}: eval.width.tier {width['tier']!r} is not one of eval.tiers")
    widths = width["widths"]
    if (
        not isinstance(widths, list)
        or not widths
        or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in widths)
    ):
        raise UsageError(f"{path}: eval.width.widths must be a list of whole numbers of at least 1")
    width["compute"] = positive_number(width["compute"], f"{path}: eval.width.compute")
    width["init_scale"] = positive_number(width["init_scale"], f"{path}: eval.width.init_scale")
    if width["limit"] is not None and (not isinstance(width["limit"], int) or width["limit"] < 1):
        raise UsageError(f"{path}: eval.width.limit must be a whole number of at least 1")
    return width


def _check_every(every: Any, path: Path) -> None:
    """A one-line error unless ``eval.every`` (batches between checkpoints) is an integer of at least 1."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UsageError(f"{path}: eval.every must be an integer of at least 1, got {every!r}")


def _split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``key=value`` overrides of an experiment, split into those of every model's run config (``model.``,
    ``train.``, ``task.``) and those of the evaluation (``eval.``, prefix removed)."""
    run, evaluation = [], []
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or key.split(".", 1)[0] not in OVERRIDE_SECTIONS or "." not in key:
            raise UsageError(
                f"override {item!r} is not KEY=VALUE with KEY in {', '.join(s + '.' for s in OVERRIDE_SECTIONS)}"
            )
        if key.startswith("eval."):
            evaluation.append(item.split(".", 1)[1])
        else:
            run.append(item)
    return run, evaluation


def _whole_number(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


# The `eval:` settings each kind of experiment reads: its file and its overrides may set these and no others (a
# kind registered later may set any of EvalSpec's).
_PUZZLE_EVAL = (
    "samples",
    "steps",
    "limit",
    "select",
    "seed",
    "temperature",
    "fit_value",
    "split",
    *GRID_FIELDS,
)
KIND_EVAL: dict[str, tuple[str, ...]] = {
    "reasoners": _PUZZLE_EVAL,
    "time-to-accuracy": (*_PUZZLE_EVAL, "every"),
    "lm": ("limit", "depths", "tiers", "width"),
    "generation": ("samples", "steps", "seed", "temperature"),
}


def _check_eval_keys(kind: str, raw_eval: dict[str, Any], overrides: Sequence[str], path: Path) -> None:
    """One-line errors for ``eval:`` settings (in the file or in ``eval.`` overrides) that ``kind`` does not
    read."""
    settings = [field.name for field in dataclasses.fields(EvalSpec)]
    unknown = set(raw_eval) - set(settings)
    if unknown:
        raise UsageError(f"{path}: unknown eval keys {', '.join(sorted(unknown))}")
    allowed = KIND_EVAL.get(kind, tuple(settings))
    given = [*raw_eval, *(item.split("=", 1)[0].strip() for item in overrides)]
    foreign = sorted({key for key in given if key in settings and key not in allowed})
    if foreign:  # an unknown key in an override is apply_overrides' to name
        raise UsageError(
            f"{path}: eval.{foreign[0]} is not a setting of kind {kind} (it reads {', '.join(allowed)})"
        )


def _check_evaluation(evaluation: EvalSpec, path: Path) -> None:
    """One-line errors for an evaluation out of range; fills in ``eval.width``'s defaults."""
    for key in ("samples", "steps"):
        if int(getattr(evaluation, key)) < 1:
            raise UsageError(f"{path}: eval.{key} must be at least 1")
    if not float(evaluation.temperature) >= 0:
        raise UsageError(f"{path}: eval.temperature must be at least 0")
    if int(evaluation.fit_value) < 0:
        raise UsageError(f"{path}: eval.fit_value must be at least 0")
    _check_every(evaluation.every, path)
    if evaluation.split not in ("test", "validation"):
        raise UsageError(f"{path}: eval.split must be test or validation, got {evaluation.split!r}")
    try:
        ComputeGrid.of(evaluation)
    except UsageError as error:
        raise UsageError(f"{path}: eval.{error}") from None
    depths = evaluation.depths
    if not isinstance(depths, list) or not depths or not all(isinstance(d, int) and d >= 1 for d in depths):
        raise UsageError(f"{path}: eval.depths must be a list of positive integers")
    _check_tiers(evaluation.tiers, path)
    evaluation.width = _parse_width(evaluation.width, evaluation.tiers, path)


def load_experiment(name_or_path: str, overrides: Sequence[str] = ()) -> Experiment:
    """An experiment by shipped name (``nqueens8``) or YAML path, validated with one-line errors.

    ``overrides`` (``key=value``) change it for this run: ``eval.*`` keys the evaluation (``eval.samples=5``),
    ``model.*``, ``train.*`` and ``task.*`` keys every model's run config (``train.seed=1``,
    ``train.compile=true``), after the experiment's own per-model overrides. A model's own ``eval.*``
    overrides change its evaluation alone (:meth:`Experiment.eval_for`), before the command line's.
    """
    run_overrides, eval_overrides = _split_overrides(overrides)
    path = Path(name_or_path)
    if not path.suffix:
        path = EXPERIMENTS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(available_experiments()) or "none"
            raise UsageError(f"unknown experiment {name_or_path!r} (known: {known})")
    data = load_yaml(path)
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"{path}: 'models' must map model names to {{config: FILE}}")
    specs = []
    for model, entry in models.items():
        if not isinstance(entry, dict) or "config" not in entry:
            raise UsageError(f"{path}: models.{model} needs a 'config' file")
        config = (path.parent / str(entry["config"])).resolve()
        if not config.is_file():
            raise UsageError(f"{path}: models.{model}.config {config} does not exist")
        try:
            own, own_eval = _split_overrides([str(o) for o in entry.get("overrides") or []])
        except UsageError as error:
            raise UsageError(f"{path}: models.{model}: {error}") from None
        reference = entry.get("reference_minutes")
        if reference is not None:
            reference = positive_number(reference, f"{path}: models.{model}.reference_minutes")
        specs.append(ModelSpec(str(model), config, [*own, *run_overrides], reference, own_eval))
    raw_eval = data.get("eval") or {}
    kind = str(data.get("kind", DEFAULT_KIND))
    if kind not in KINDS:
        raise UsageError(f"{path}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    own_evals = [item for spec in specs for item in spec.eval_overrides]
    _check_eval_keys(kind, raw_eval, [*eval_overrides, *own_evals], path)
    _check_every(raw_eval.get("every", 1), path)  # the file's own value, before overrides coerce it
    _check_tiers(raw_eval.get("tiers", {}), path)
    try:
        evaluation = apply_overrides(EvalSpec(**raw_eval), eval_overrides)
    except UsageError as error:
        raise UsageError(f"eval override: {error}") from None
    _check_evaluation(evaluation, path)
    targets = _parse_targets(data.get("targets"), path)
    expected = data.get("expected_minutes")
    jobs = _whole_number(data.get("jobs", 1), f"{path}: jobs")
    threads = data.get("threads_per_model")
    threads = None if threads is None else _whole_number(threads, f"{path}: threads_per_model")
    experiment = Experiment(
        name=path.stem,
        path=path,
        description=str(data.get("description", "")).strip(),
        budget_minutes=(
            None
            if data.get("budget_minutes") is None
            else positive_number(data["budget_minutes"], f"{path}: budget_minutes")
        ),
        models=specs,
        eval=evaluation,
        paper={str(k): dict(v) for k, v in (data.get("paper") or {}).items()},
        paper_note=str(data.get("paper_note", "")).strip(),
        expected_minutes=float(expected) if expected is not None else None,
        kind=kind,
        overrides=list(overrides),
        targets=targets,
        jobs=jobs,
        threads_per_model=threads,
    )
    for spec in specs:
        try:
            own = experiment.eval_for(spec)
        except UsageError as error:
            raise UsageError(f"{path}: models.{spec.name}: eval override: {error}") from None
        _check_evaluation(own, path)
    return experiment
