"""Models trained side by side: a pool of worker processes, each on a share of the cores, and the watchdog
that stops a worker whose ``latentloop run`` has died."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch


def log_to_stderr(line: str) -> None:
    """A log line on standard error, at once (several processes share it)."""
    print(line, file=sys.stderr, flush=True)


def stop_when_orphaned(parent: int, poll_s: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM once its parent is no longer ``parent`` (it died and the process was
    adopted), checked every ``poll_s`` seconds: a worker whose ``latentloop run`` was killed then checkpoints
    and stops, rather than train on with no one to report to, or beside a restarted run in the same folder."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-when-orphaned", daemon=True)
    thread.start()
    return thread


def threads_per_job(jobs: int) -> int:
    """The torch threads each of ``jobs`` models trained at once gets: an equal share of this process's."""
    return max(1, torch.get_num_threads() // jobs)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block on ``threads`` torch threads, then restore the process's own count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _in_worker(threads: int, parent: int, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args, progress, log)`` in a worker process of its own, on ``threads`` of the machine's
    cores; it logs to standard error and shows no progress bar (several would overwrite each other).
    Interrupted (Ctrl-C, or SIGTERM from its parent's death or the pool's shutdown), it exits once training has
    checkpointed instead of taking the next call from the pool's queue."""
    torch.set_num_threads(threads)
    stop_when_orphaned(parent)
    try:
        return function(*args, False, log_to_stderr)
    except KeyboardInterrupt:
        os._exit(130)


def run_side_by_side(
    function: Callable[..., Any], calls: dict[str, tuple[Any, ...]], jobs: int, threads: int
) -> dict[str, Any]:
    """``function(*args, progress, log)`` for each name -> ``args`` of ``calls``, ``jobs`` at once, each in its
    own process on ``threads`` torch threads; the results by name, in the order of ``calls``.

    ``function`` must be importable by name (a module's top-level function): the workers are spawned.
    A worker that stops (interrupted, killed, out of memory) ends the run as a ``KeyboardInterrupt``.
    """
    context = multiprocessing.get_context("spawn")  # forking a process that has run torch is unsafe
    parent = os.getpid()
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {
                name: pool.submit(_in_worker, threads, parent, function, *args)
                for name, args in calls.items()
            }
            return {name: future.result() for name, future in futures.items()}
    except BrokenProcessPool:  # the pool has stopped the other workers, which checkpoint as they go
        log_to_stderr("a worker process stopped (interrupted, killed or out of memory); run again to resume")
        raise KeyboardInterrupt from None
