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

import functools
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
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

    Once this machine's speed is measured on the first steps (:class:`~latentloop.train.monitor.Pace`), the
    expected wall-clock seconds of the whole schedule (the time spent so far included) go to ``on_pace``, and
    to ``log`` as a line; the progress bar's time left follows the same measure.

    Launched by ``torchrun`` (``WORLD_SIZE > 1``) it trains data-parallel; only rank 0 writes to ``out_dir``
    and logs, and every rank returns the same result.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    tc = config.train
    task = get_task(config.task.name, **config.task.options)
    settle_vector_math()
    ctx, device = dist.setup(resolve_device(tc.device))
    dist.check_batch(tc.batch_size, ctx)
    if not ctx.is_main:
        progress, log = False, None
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
    start_step, seen, state = 0, 0, None
    fitted: int | None = None  # train.fit_steps: the steps fitted to the budget, once they are
    if checkpoint is not None:
        state, torch_rng = load_training_state(checkpoint, optimizer)
        start_step, seen = state["step"], int(state.get(objective.seen, 0))
        objective.flops = int(state.get("flops", 0))
        started -= float(state.get("train_seconds", 0.0))  # the budget covers the whole run
        if state.get("fitted_steps"):  # the schedule this run fitted to its budget when it started
            fitted = tc.steps = int(state["fitted_steps"])
        restore_training_rng(state, torch_rng, ctx.rank, ctx.world_size)
        objective.resume(checkpoint, log)
        if log:
            log(f"resuming from {checkpoint} (step {start_step})")
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

    metrics = MetricsLog(out, start_step, tc.tensorboard, enabled=ctx.is_main)
    end_step = tc.steps if stop_at is None else min(tc.steps, stop_at)
    budget_s = tc.budget_minutes * 60 if tc.budget_minutes else math.inf
    # train.fit_steps: steps [fit_from, fit_to) of this call are timed (the first FIT_SKIP compile), then the
    # schedule is fitted to what is left of the budget.
    fitting = tc.fit_steps and fitted is None
    fit_from = start_step + FIT_SKIP
    fit_to = fit_from + max(FIT_MIN_STEPS, math.ceil(FIT_SHARE * tc.steps))
    fit_start: tuple[float, int] = (0.0, 0)
    losses: list[float] = []
    last_eval: dict[str, Any] | None = None
    last_saved, saved_step = checkpoint, (start_step if checkpoint is not None else -1)
    stopped, step = "steps", start_step
    window_seen, window_time = 0, 0.0
    phase = f"{progress} train" if isinstance(progress, str) else "train"
    bar = ProgressBar(bool(progress), tc.steps, start_step, phase, objective.unit, budget_s, started)
    pace = Pace(start_step, skip=FIT_SKIP)

    def save(at: int) -> Path:
        # Every rank hands its RNG states to rank 0, which alone writes the checkpoint.
        rank_rng = dist.gather_objects(capture_rank_rng(), ctx)
        saved_model, saved_optimizer = objective.saved_parts(updates.optimizer)
        path = out / "checkpoints" / checkpoint_name(at)
        if ctx.is_main:
            trainer_state = {
                objective.seen: seen,
                "flops": objective.flops,
                "train_seconds": time.perf_counter() - started,
                "precision": precision,
                "seed": tc.seed,
                "world_size": ctx.world_size,
                **({"fitted_steps": fitted} if fitted else {}),
                **objective.checkpoint_state(),
            }
            path = save_checkpoint(
                out, at, saved_model, saved_optimizer, trainer_state, tc.keep_checkpoints, rank_rng=rank_rng
            )
        dist.barrier(ctx)
        return path

    def evaluate() -> dict[str, Any]:
        record, line = objective.evaluate(step)
        metrics.write(record)
        if log:
            log(line)
        return record

    interrupt = InterruptFlag()
    try:
        with bar, interrupt:
            while step < end_step:
                unsaved = functools.partial(save, step) if step > saved_step else None
                if interrupt.should_stop(ctx, started, budget_s, checkpoint=unsaved):
                    stopped = "budget"
                    break
                tick = time.perf_counter()
                try:
                    step_losses, consumed = objective.train_step(step, updates)
                except TrainingError as error:
                    raise TrainingError(
                        f"{error}; last checkpoint: {last_saved or 'none'}; try a lower train.lr"
                    ) from None
                step += 1
                seen += consumed
                if fitting and step == fit_from:
                    fit_start = time.perf_counter(), objective.flops
                elif fitting and step == fit_to:
                    rate = (objective.flops - fit_start[1]) / max(time.perf_counter() - fit_start[0], 1e-9)
                    left = FIT_FILL * budget_s - (time.perf_counter() - started)
                    fitted = dist.broadcast_object(fitted_steps(objective, step, rate, left, tc.steps), ctx)
                    fitting, tc.steps = False, fitted
                    end_step = tc.steps if stop_at is None else min(tc.steps, stop_at)
                    bar.set_total(tc.steps)
                    if log:
                        log(f"schedule fitted to the budget: {tc.steps} steps ({rate:.3g} FLOP/s)")
                losses.extend(step_losses)
                window_seen += consumed
                window_time += time.perf_counter() - tick
                rate = window_seen / max(window_time, 1e-9)
                pace.observe(step, objective.flops)
                left = None  # priced only where the bar shows it or the estimate is announced
                if bar.enabled or pace.ready(step):
                    planned = objective.schedule_flops(tc.steps, step, objective.flops)
                    left = pace.seconds_left(planned, objective.flops)
                if pace.ready(step) and left is not None:
                    expected = time.perf_counter() - started + left
                    if on_pace is not None:
                        on_pace(expected)
                    if log:
                        log(f"the {tc.steps} steps take about {expected / 60:.1f} min on this machine")
                accuracy = last_eval.get("accuracy") if last_eval else None
                bar.update(step, step_losses[-1], rate, accuracy, schedule_left=left)
                if step % tc.log_every == 0 or step == end_step:
                    record, line = objective.train_record(seen, rate, updates.lr)
                    record = {"kind": "train", "step": step, **record, "flops": objective.flops}
                    record["elapsed_s"] = round(time.perf_counter() - started, 3)
                    metrics.write(record)
                    if log:
                        log(f"step {step:>6}  {line}")
                    window_seen, window_time = 0, 0.0
                if tc.eval_every and tc.eval_size and step % tc.eval_every == 0:
                    last_eval = evaluate()
                if tc.checkpoint_every and step % tc.checkpoint_every == 0:
                    last_saved = save(step)
                    saved_step = step
            if stop_at is not None and step >= stop_at and step < tc.steps:
                stopped = "stop_at"
        if step != saved_step:
            last_saved = save(step)
        if stopped != "stop_at" and tc.eval_size and (last_eval is None or last_eval["step"] != step):
            last_eval = evaluate()
    finally:
        metrics.close()
    return TrainResult(
        out_dir=out,
        step=step,
        losses=losses,
        checkpoint=last_saved,
        stopped=stopped,
        precision=precision,
        elapsed_s=time.perf_counter() - started,
        resumed_from=start_step,
        counts={**objective.counts(seen), "flops": objective.flops},
        last_eval=last_eval,
    )
