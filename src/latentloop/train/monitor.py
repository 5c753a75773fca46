"""What a training run shows and records while it runs: ``metrics.jsonl`` (and TensorBoard), the progress
bar, and the Ctrl-C/SIGTERM flag that turns an interruption into a checkpoint between steps."""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from latentloop.io import atomic_write_text
from latentloop.train import distributed as dist


class MetricsLog:
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
            atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))
        self.stream = self.path.open("a")
        self.writer = None
        if tensorboard:
            try:  # tensorboard is optional (train.tensorboard is on by default and used where installed)
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:
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


class Pace:
    """This machine's training speed and the time a fixed schedule still takes at it.

    The speed is FLOPs per second, measured from ``skip`` steps after the first (the compiler's first calls
    are slower) to the latest step. The time left is the schedule's remaining FLOPs over that speed, so the
    deeper steps a curriculum has still to come count for what they cost. The estimate is ``ready`` once
    ``window`` steps have been timed: that is when a run announces its expected duration.
    """

    def __init__(self, first_step: int, skip: int = 10, window: int = 20) -> None:
        self.from_step, self.ready_step = first_step + skip, first_step + skip + window
        self.mark: tuple[float, float] | None = None
        self.flops_per_s: float | None = None

    def observe(self, step: int, flops: float) -> None:
        """Record that ``step`` steps are done, having spent ``flops`` FLOPs in all."""
        now = time.perf_counter()
        if step == self.from_step:
            self.mark = now, flops
        elif self.mark is not None and now > self.mark[0] and flops > self.mark[1]:
            self.flops_per_s = (flops - self.mark[1]) / (now - self.mark[0])

    def ready(self, step: int) -> bool:
        """Whether ``step`` is the step at which the estimate is first trusted."""
        return step == self.ready_step and self.flops_per_s is not None

    def seconds_left(self, planned_flops: float, flops: float) -> float | None:
        """Seconds until the schedule's ``planned_flops`` are spent, ``flops`` being spent; None before the
        speed is measured."""
        if self.flops_per_s is None:
            return None
        return max(0.0, planned_flops - flops) / self.flops_per_s


class ProgressBar:
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

    def set_total(self, total: int) -> None:
        """A new number of steps (the schedule was fitted to the time budget)."""
        self.total = total
        if self.progress is not None:
            self.progress.update(self.task, total=total)

    def __enter__(self) -> ProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def seconds_left(self, step: int, schedule_left: float | None = None) -> float:
        """The sooner of the remaining schedule's time and the remaining budget. ``schedule_left``: that time
        as :class:`Pace` measures it; without it, the remaining steps at this run's average pace."""
        now = time.perf_counter()
        done = step - self.first_step
        if schedule_left is not None:
            by_steps = schedule_left
        else:
            by_steps = (self.total - step) * (now - self.first_time) / done if done > 0 else math.inf
        return max(0.0, min(by_steps, self.budget_s - (now - self.started)))

    def update(
        self,
        step: int,
        loss: float,
        rate: float,
        accuracy: float | None = None,
        schedule_left: float | None = None,
    ) -> None:
        if self.progress is None:
            return
        left = self.seconds_left(step, schedule_left)
        fields: dict[str, Any] = {"loss": loss, "rate": rate}
        fields["left"] = f"{int(left // 60)}:{int(left % 60):02d} left" if math.isfinite(left) else ""
        if accuracy is not None:
            fields["accuracy"] = f"acc {accuracy:.1%}"
        self.progress.update(self.task, completed=step, **fields)


class InterruptFlag:
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

    def __enter__(self) -> InterruptFlag:
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
