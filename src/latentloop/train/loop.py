"""The training loop shared by every model of latentloop.

:func:`train` owns a run: its folder (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``), resuming from the
newest checkpoint, the device and precision, the process group, the time budget and interruptions, and the
cadence of logging, evaluation and checkpoints. What differs between model families is an
:class:`Objective`: it builds the model, runs one training step (the LM's sampled-depth step, or the
reasoners' ``n_sup`` deep-supervision updates), evaluates, and adds its own state to checkpoints.

A step is a pure function of ``(seed, step)`` and of what the checkpoint holds (weights, optimizer moments,
RNG states, the objective's extra state), so a run resumed from a checkpoint reproduces the uninterrupted
run's losses exactly on the same machine.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latentloop.errors import UsageError
from latentloop.runtime import settle_vector_math
from latentloop.tasks.base import get_task
from latentloop.train import distributed as dist
from latentloop.train.checkpoint import (
    capture_rank_rng,
    checkpoint_name,
    latest_checkpoint,
    load_training_state,
    restore_training_rng,
    save_checkpoint,
)
from latentloop.train.deep_supervision import DeepSupervision
from latentloop.train.language_model import LanguageModelObjective
from latentloop.train.monitor import InterruptFlag, MetricsLog, Pace, ProgressBar
from latentloop.train.objective import Objective, TrainingError, Updates
from latentloop.train.optim import build_optimizer
from latentloop.train.precision import choose_precision, resolve_device, resumed_precision, seed_everything
from latentloop.train.run_config import ReasonerRunConfig, RunConfig, save_run_config

# The objective that trains each family's run config.
OBJECTIVES: dict[type, type[Objective]] = {
    RunConfig: LanguageModelObjective,
    ReasonerRunConfig: DeepSupervision,
}


@dataclass
class TrainResult:
    """What a call to :func:`train` did. ``losses`` has one entry per optimizer update; ``counts`` holds the
    objective's totals (``tokens_seen``; or ``examples_seen`` and ``parameters``)."""

    out_dir: Path
    step: int
    losses: list[float]
    checkpoint: Path | None
    stopped: str
    precision: str
    elapsed_s: float
    resumed_from: int
    counts: dict[str, int]
    last_eval: dict[str, Any] | None = None


# train.fit_steps: steps left out of the timing (the compiler's first calls), the fewest steps timed and the
# share of the schedule timed when that is more, and the share of the budget the fitted schedule fills (the
# rest absorbs the machine's changes of speed and the final checkpoint). 5% of the schedule, not 1%: runs
# side by side compile while the other times its steps, and a 1% window read TRM at 0.7x its later speed.
FIT_SKIP, FIT_MIN_STEPS, FIT_SHARE, FIT_FILL = 10, 20, 0.05, 0.97


def fitted_steps(objective: Objective, step: int, flops_per_s: float, seconds_left: float, most: int) -> int:
    """The longest schedule, of at most ``most`` steps, whose FLOPs after the ``step`` steps done take at most
    ``seconds_left`` at ``flops_per_s``; never fewer than the steps done. The cost of a schedule comes from
    :meth:`Objective.schedule_flops`, so a curriculum's deeper steps count for what they cost."""
    spent = objective.flops

    def fits(steps: int) -> bool:
        return objective.schedule_flops(steps, step, spent) - spent <= flops_per_s * seconds_left

    if fits(most):
        return most
    low, high = step, most  # fits(high) is false; low is the steps done, the least a schedule can be
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


@dataclass
class _Run:
    """One call's training run: what :func:`_open` built, the steps done, and the window of steps since the last
    logged one. The hooks (:class:`_BudgetFit`, :class:`_Progress`, :class:`_Cadence`) read and advance it."""

    config: Any
    out: Path
    ctx: dist.DistContext
    objective: Objective
    updates: Updates
    metrics: MetricsLog
    precision: str
    started: float
    log: Callable[[str], None] | None
    stop_at: int | None
    step: int = 0
    seen: int = 0
    resumed_from: int = 0
    fitted: int | None = None  # train.fit_steps: the steps fitted to the budget, once they are
    last_saved: Path | None = None
    saved_step: int = -1
    last_eval: dict[str, Any] | None = None
    losses: list[float] = field(default_factory=list)
    window_seen: int = 0
    window_time: float = 0.0

    @property
    def tc(self) -> Any:
        return self.config.train

    @property
    def end_step(self) -> int:
        """Where this call stops: the schedule's end, or ``stop_at`` when that comes first."""
        return self.tc.steps if self.stop_at is None else min(self.tc.steps, self.stop_at)

    @property
    def budget_s(self) -> float:
        return self.tc.budget_minutes * 60 if self.tc.budget_minutes else math.inf

    @property
    def rate(self) -> float:
        """Examples (or tokens) per second over the window."""
        return self.window_seen / max(self.window_time, 1e-9)

    def say(self, line: str) -> None:
        if self.log:
            self.log(line)

    def train_step(self) -> list[float]:
        """One step of the objective; its losses."""
        tick = time.perf_counter()
        try:
            losses, consumed = self.objective.train_step(self.step, self.updates)
        except TrainingError as error:
            raise TrainingError(
                f"{error}; last checkpoint: {self.last_saved or 'none'}; try a lower train.lr"
            ) from None
        self.step, self.seen = self.step + 1, self.seen + consumed
        self.losses.extend(losses)
        self.window_seen += consumed
        self.window_time += time.perf_counter() - tick
        return losses

    def save(self) -> None:
        """A checkpoint of the state after ``step`` steps: every rank hands its RNG states to rank 0, which alone
        writes it."""
        rank_rng = dist.gather_objects(capture_rank_rng(), self.ctx)
        saved_model, saved_optimizer = self.objective.saved_parts(self.updates.optimizer)
        path = self.out / "checkpoints" / checkpoint_name(self.step)
        if self.ctx.is_main:
            trainer_state = {
                self.objective.seen: self.seen,
                "flops": self.objective.flops,
                "train_seconds": time.perf_counter() - self.started,
                "precision": self.precision,
                "seed": self.tc.seed,
                "world_size": self.ctx.world_size,
                **({"fitted_steps": self.fitted} if self.fitted else {}),
                **self.objective.checkpoint_state(),
            }
            path = save_checkpoint(
                self.out,
                self.step,
                saved_model,
                saved_optimizer,
                trainer_state,
                self.tc.keep_checkpoints,
                rank_rng=rank_rng,
            )
        dist.barrier(self.ctx)
        self.last_saved, self.saved_step = path, self.step

    def evaluate(self) -> None:
        record, line = self.objective.evaluate(self.step)
        self.metrics.write(record)
        self.say(line)
        self.last_eval = record

    def should_stop(self, interrupt: InterruptFlag) -> bool:
        """Between steps: whether the time budget is spent (an interruption saves a checkpoint and raises)."""
        unsaved = self.save if self.step > self.saved_step else None
        return interrupt.should_stop(self.ctx, self.started, self.budget_s, checkpoint=unsaved)

    def result(self, stopped: str) -> TrainResult:
        return TrainResult(
            out_dir=self.out,
            step=self.step,
            losses=self.losses,
            checkpoint=self.last_saved,
            stopped=stopped,
            precision=self.precision,
            elapsed_s=time.perf_counter() - self.started,
            resumed_from=self.resumed_from,
            counts={**self.objective.counts(self.seen), "flops": self.objective.flops},
            last_eval=self.last_eval,
        )


def _open(config: Any, out: Path, log: Callable[[str], None] | None, stop_at: int | None) -> _Run:
    """The run in ``out``, ready for its first step: the folder, the task's data, the model and optimizer
    (restored from the newest checkpoint when there is one), the precision and ``config.yaml``."""
    started = time.perf_counter()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    tc = config.train
    task = get_task(config.task.name, **config.task.options)
    settle_vector_math()
    ctx, device = dist.setup(resolve_device(tc.device))
    dist.check_batch(tc.batch_size, ctx)
    log = log if ctx.is_main else None
    objective = OBJECTIVES[type(config)](config, task, out, ctx, device)
    fresh = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        objective.setup()
    except UsageError:
        if fresh and ctx.is_main:  # a config the data refuses leaves no run folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    seed_everything(tc.seed)
    found = dist.broadcast_object(str(latest_checkpoint(out) or ""), ctx)  # rank 0 picks it for all
    checkpoint = Path(found) if found else None
    optimizer = build_optimizer(objective.build(checkpoint), tc.lr, tc.betas, tc.weight_decay, tc.eps)
    step, seen, state, fitted = 0, 0, None, None
    if checkpoint is not None:
        state, torch_rng = load_training_state(checkpoint, optimizer)
        step, seen = state["step"], int(state.get(objective.seen, 0))
        objective.flops = int(state.get("flops", 0))
        started -= float(state.get("train_seconds", 0.0))  # the budget covers the whole run
        if state.get("fitted_steps"):  # the schedule this run fitted to its budget when it started
            fitted = tc.steps = int(state["fitted_steps"])
        restore_training_rng(state, torch_rng, ctx.rank, ctx.world_size)
        objective.resume(checkpoint, log)
        if log:
            log(f"resuming from {checkpoint} (step {step})")
    # "auto" times matmuls, which may come out differently on each rank: rank 0's choice holds for all, and a
    # resumed run keeps the choice it made when it started.
    requested = resumed_precision(tc.precision, state)
    width, hidden = objective.precision_probe()
    precision = dist.broadcast_object(
        choose_precision(requested, width, hidden, tc.batch_size * task.seq_len, device), ctx
    )
    objective.precision = precision
    optimizer = objective.prepare(optimizer, checkpoint)
    updates = Updates(optimizer, objective.model, tc, objective.updates_per_step)
    if ctx.is_main:
        save_run_config(config, out / "config.yaml")
    metrics = MetricsLog(out, step, tc.tensorboard, enabled=ctx.is_main)
    return _Run(
        config,
        out,
        ctx,
        objective,
        updates,
        metrics,
        precision,
        started,
        log,
        stop_at,
        step=step,
        seen=seen,
        resumed_from=step,
        fitted=fitted,
        last_saved=checkpoint,
        saved_step=step if checkpoint is not None else -1,
    )


class _BudgetFit:
    """``train.fit_steps``: steps ``[fit_from, fit_to)`` of this call are timed (the first ``FIT_SKIP`` compile),
    then the schedule becomes the longest that fits what is left of the budget at that speed
    (:func:`fitted_steps`). The fitted schedule is the run's from then on (``train.steps``, which the objective's
    curriculum and learning rate read), and its checkpoints keep it."""

    def __init__(self, run: _Run, bar: ProgressBar) -> None:
        self.active = run.tc.fit_steps and run.fitted is None
        self.fit_from = run.step + FIT_SKIP
        self.fit_to = self.fit_from + max(FIT_MIN_STEPS, math.ceil(FIT_SHARE * run.tc.steps))
        self.mark: tuple[float, int] = (0.0, 0)
        self.bar = bar

    def after_step(self, run: _Run) -> None:
        if self.active and run.step == self.fit_from:
            self.mark = time.perf_counter(), run.objective.flops
        elif self.active and run.step == self.fit_to:
            rate = (run.objective.flops - self.mark[1]) / max(time.perf_counter() - self.mark[0], 1e-9)
            left = FIT_FILL * run.budget_s - (time.perf_counter() - run.started)
            steps = fitted_steps(run.objective, run.step, rate, left, run.tc.steps)
            run.fitted = run.tc.steps = dist.broadcast_object(steps, run.ctx)
            self.active = False
            self.bar.set_total(run.tc.steps)
            run.say(f"schedule fitted to the budget: {run.tc.steps} steps ({rate:.3g} FLOP/s)")


class _Progress:
    """The progress bar and this machine's pace: once the speed is measured on the first steps
    (:class:`~latentloop.train.monitor.Pace`), the expected seconds of the whole schedule (the time spent so far
    included) go to ``on_pace`` and to the log; the bar's time left follows the same measure."""

    def __init__(self, run: _Run, bar: ProgressBar, on_pace: Callable[[float], None] | None) -> None:
        self.pace, self.bar, self.on_pace = Pace(run.step, skip=FIT_SKIP), bar, on_pace

    def after_step(self, run: _Run) -> None:
        self.pace.observe(run.step, run.objective.flops)
        left = None  # priced only where the bar shows it or the estimate is announced
        if self.bar.enabled or self.pace.ready(run.step):
            planned = run.objective.schedule_flops(run.tc.steps, run.step, run.objective.flops)
            left = self.pace.seconds_left(planned, run.objective.flops)
        if self.pace.ready(run.step) and left is not None:
            expected = time.perf_counter() - run.started + left
            if self.on_pace is not None:
                self.on_pace(expected)
            run.say(f"the {run.tc.steps} steps take about {expected / 60:.1f} min on this machine")
        accuracy = run.last_eval.get("accuracy") if run.last_eval else None
        self.bar.update(run.step, run.losses[-1], run.rate, accuracy, schedule_left=left)


class _Cadence:
    """Every ``train.log_every`` steps (and at the end of the call) a training record, every ``eval_every`` an
    evaluation, every ``checkpoint_every`` a checkpoint."""

    def after_step(self, run: _Run) -> None:
        tc = run.tc
        if run.step % tc.log_every == 0 or run.step == run.end_step:
            record, line = run.objective.train_record(run.seen, run.rate, run.updates.lr)
            record = {"kind": "train", "step": run.step, **record, "flops": run.objective.flops}
            record["elapsed_s"] = round(time.perf_counter() - run.started, 3)
            run.metrics.write(record)
            run.say(f"step {run.step:>6}  {line}")
            run.window_seen, run.window_time = 0, 0.0
        if tc.eval_every and tc.eval_size and run.step % tc.eval_every == 0:
            run.evaluate()
        if tc.checkpoint_every and run.step % tc.checkpoint_every == 0:
            run.save()


@dist.leaves_group
def train(
    config: Any,
    out_dir: str | Path,
    progress: bool | str = False,
    log: Callable[[str], None] | None = None,
    stop_at: int | None = None,
    on_pace: Callable[[float], None] | None = None,
) -> TrainResult:
    """Train (or resume) the run in ``out_dir`` until ``train.steps`` steps or ``train.budget_minutes``.

    ``config`` is a run config of any model family (see :mod:`latentloop.train.run_config`); ``OBJECTIVES``
    names the objective that trains it. The run resumes from the newest complete checkpoint of ``out_dir``
    when there is one. ``progress`` shows a progress bar (a string names the phase on
    it); ``log`` receives one text line per logged step. ``stop_at`` ends this call after that many steps (as
    an interruption would), with a checkpoint, without changing the schedule. Raises :class:`TrainingError`
    when the loss stops being finite.

    Once this machine's speed is measured on the first steps, the expected wall-clock seconds of the whole
    schedule go to ``on_pace``, and to ``log`` as a line (:class:`_Progress`).

    Launched by ``torchrun`` (``WORLD_SIZE > 1``) it trains data-parallel; only rank 0 writes to ``out_dir``
    and logs, and every rank returns the same result.
    """
    run = _open(config, Path(out_dir), log, stop_at)
    phase = f"{progress} train" if isinstance(progress, str) else "train"
    bar = ProgressBar(
        bool(progress) and run.ctx.is_main,
        run.tc.steps,
        run.step,
        phase,
        run.objective.unit,
        run.budget_s,
        run.started,
    )
    hooks = (_BudgetFit(run, bar), _Progress(run, bar, on_pace), _Cadence())
    stopped, interrupt = "steps", InterruptFlag()
    try:
        with bar, interrupt:
            while run.step < run.end_step:
                if run.should_stop(interrupt):
                    stopped = "budget"
                    break
                run.train_step()
                for hook in hooks:
                    hook.after_step(run)
            if stop_at is not None and stop_at <= run.step < run.tc.steps:
                stopped = "stop_at"
        if run.step != run.saved_step:
            run.save()
        if stopped != "stop_at" and run.tc.eval_size and (run.last_eval or {}).get("step") != run.step:
            run.evaluate()
    finally:
        run.metrics.close()
    return run.result(stopped)
