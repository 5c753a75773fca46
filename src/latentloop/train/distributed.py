"""Data-parallel training across processes (``torchrun``): the process group, rank helpers, batch sharding.

Both trainers run unchanged in one process; under ``torchrun`` they call :func:`setup`, which joins the process
group that torchrun's environment describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``): gloo on CPU, NCCL on GPU. The design that keeps N processes equal to one:

- The global batch of a step is the same pure function of ``(seed, step)`` as in one process; every rank
  builds it and keeps its contiguous slice of ``batch_size / world_size`` rows (:func:`shard`). Shards never
  overlap and together are exactly the one-process batch.
- Every rank seeds its generators identically and draws the same random numbers (e.g. the recurrent-depth
  LM's initial state is drawn for the global batch and sliced), so the RNG state after a step does not depend
  on the number of processes; a run can therefore resume with a different process count.
- DistributedDataParallel averages gradients over ranks; with equal shards (and losses weighted by each
  shard's share of the global normaliser) the average is the one-process gradient of the global batch.
- Only rank 0 writes checkpoints, metrics and log lines (:attr:`DistContext.is_main`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from latentloop.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job. ``world_size == 1`` is a plain single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    owns_group: bool = False  # whether :func:`setup` created the process group (and :func:`shutdown` ends it)

    @property
    def enabled(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints, metrics and logs."""
        return self.rank == 0


SINGLE = DistContext()


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"environment variable {name} must be an integer, got {text!r}") from None


def env_rank() -> int:
    """The rank that torchrun gave this process (0 outside torchrun)."""
    return _env_int("RANK", 0)


def env_world_size() -> int:
    """The number of processes torchrun started (1 outside torchrun)."""
    return _env_int("WORLD_SIZE", 1)


def setup(device: str) -> tuple[DistContext, str]:
    """Join torchrun's process group when ``WORLD_SIZE > 1`` and return ``(context, device)``.

    ``device`` is the resolved training device (``cpu``, ``cuda`` or ``cuda:N``); on GPU each process takes
    ``cuda:LOCAL_RANK``. An already initialised default group (e.g. set up by the caller) is reused.
    """
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = _env_int("LOCAL_RANK", rank)
        return DistContext(rank, world, local, dist.get_backend(), owns_group=False), _rank_device(
            device, local, world
        )
    world = env_world_size()
    if world <= 1:
        return SINGLE, device
    if not dist.is_available():
        raise UsageError("WORLD_SIZE > 1, but this torch build has no torch.distributed")
    missing = [name for name in _ENV if not os.environ.get(name)]
    if missing:
        raise UsageError(
            f"WORLD_SIZE={world} but {', '.join(missing)} unset; launch multi-process runs with torchrun"
        )
    rank, local = env_rank(), _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world:
        raise UsageError(f"RANK={rank} is outside 0..{world - 1}")
    device = _rank_device(device, local, world)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world)
    return DistContext(rank, world, local, backend, owns_group=True), device


def _rank_device(device: str, local_rank: int, world: int) -> str:
    if not device.startswith("cuda") or world <= 1:
        return device
    if ":" in device and _env_int("LOCAL_WORLD_SIZE", 1) > 1:
        raise UsageError(
            f"train.device={device} names one GPU for several processes; use train.device=cuda "
            "(each process takes cuda:LOCAL_RANK)"
        )
    return device if ":" in device else f"cuda:{local_rank}"


def shutdown(ctx: DistContext) -> None:
    """Leave the process group if :func:`setup` created it."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def check_batch(batch_size: int, ctx: DistContext, name: str = "train.batch_size") -> None:
    """Every rank needs an equal, non-empty shard of the global batch."""
    if batch_size % ctx.world_size:
        raise UsageError(
            f"{name}={batch_size} does not split evenly over {ctx.world_size} processes; "
            f"use a multiple of {ctx.world_size}"
        )


def shard_bounds(rows: int, ctx: DistContext) -> tuple[int, int]:
    """``[start, stop)`` of this rank's contiguous share of ``rows`` (the first ranks take one more when the
    rows do not divide evenly)."""
    base, extra = divmod(rows, ctx.world_size)
    start = ctx.rank * base + min(ctx.rank, extra)
    return start, start + base + (1 if ctx.rank < extra else 0)


def shard(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """This rank's contiguous slice of the rows of ``tensor`` (the tensor itself in one process)."""
    if not ctx.enabled:
        return tensor
    start, stop = shard_bounds(tensor.shape[0], ctx)
    return tensor[start:stop]


def wrap(model: torch.nn.Module, ctx: DistContext, device: str) -> torch.nn.Module:
    """``model`` under DistributedDataParallel when there are several processes, else ``model`` itself.

    DDP broadcasts rank 0's parameters and buffers at construction, so every rank starts from the same
    weights even if it built or loaded them separately.
    """
    if not ctx.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids)


def broadcast_module(module: torch.nn.Module, ctx: DistContext) -> None:
    """Copy rank 0's parameters and buffers into ``module`` on every rank."""
    if not ctx.enabled:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def average_gradients(params: Sequence[torch.nn.Parameter], ctx: DistContext) -> None:
    """Average the gradients of ``params`` over ranks, in place (one all-reduce per dtype).

    This is what DDP does during backward, for models whose forward returns state (a carry) that holds
    parameters' outputs which the loss of this step does not use: DDP would wait for those gradients, which
    never come. Parameters without a gradient keep none, as in one process; every rank runs the same graph,
    so every rank has gradients for the same parameters.
    """
    if not ctx.enabled:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
    for grads in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= ctx.world_size
        for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)


def _tensor(values: Sequence[float], ctx: DistContext) -> torch.Tensor:
    device = torch.device("cuda", torch.cuda.current_device()) if ctx.backend == "nccl" else "cpu"
    return torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)


def all_reduce_sum(values: Sequence[float], ctx: DistContext) -> list[float]:
    """Element-wise sums over ranks (in float64, so sums of per-rank parts round once)."""
    if not ctx.enabled:
        return [float(v) for v in values]
    tensor = _tensor(values, ctx)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.cpu().tolist()


def all_reduce_mean(values: Sequence[float], ctx: DistContext) -> list[float]:
    """Element-wise means over ranks."""
    return [v / ctx.world_size for v in all_reduce_sum(values, ctx)]


def any_rank(flags: Sequence[bool], ctx: DistContext) -> list[bool]:
    """For each flag, whether it is set on any rank: decisions such as "stop now" must be taken by all ranks
    at the same step, or the ones that go on wait forever for the ones that stopped."""
    if not ctx.enabled:
        return [bool(f) for f in flags]
    tensor = _tensor([1.0 if f else 0.0 for f in flags], ctx)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [v > 0 for v in tensor.cpu().tolist()]


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's ``obj`` on every rank, in rank order (``[obj]`` in one process)."""
    if not ctx.enabled:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not ctx.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    """Wait until every rank gets here."""
    if ctx.enabled:
        dist.barrier()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (``model`` itself otherwise)."""
    return getattr(model, "module", model)


def leaves_group(function: F) -> F:
    """Decorator: a process group that :func:`setup` created during the call is destroyed when it returns or
    raises (one the caller had already set up is left alone)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        had_group = dist.is_available() and dist.is_initialized()
        try:
            return function(*args, **kwargs)
        finally:
            if not had_group and dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()

    return wrapper  # type: ignore[return-value]
