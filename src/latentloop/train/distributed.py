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

``train.parallel=fsdp`` shards parameters, gradients and optimizer moments over the ranks instead of
replicating them (FSDP2, :func:`fully_shard_model`); the arithmetic is the same as DDP's (each rank's gradient
is the mean over ranks), so the losses match up to float rounding. Checkpoints keep the single-file layout:
the full state is gathered to rank 0 for saving (:func:`gather_full_state`) and a full checkpoint is split
back into shards on resume (:func:`load_full_optimizer_state`), so a run may switch between DDP, FSDP and one
process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

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
    device_ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids)


def fully_shard_model(
    model: torch.nn.Module, blocks: Iterable[torch.nn.Module], ctx: DistContext, device: str
) -> torch.nn.Module:
    """``model`` fully sharded over the ranks with FSDP2 (in place), or ``model`` itself in one process.

    Each of ``blocks`` becomes its own group, all-gathered only around its own forward and backward (a block
    that runs several times in one forward, such as the recurrent core, is gathered for each run), then the
    root takes the parameters left over (embeddings, norms, head; tied weights stay tied). The parameters may
    be on the CPU: FSDP moves only each rank's shard to ``device``, so the full model never has to fit one
    accelerator. Every rank must pass the same weights (the same seed or checkpoint); unlike DDP, FSDP does
    not broadcast them, it keeps each rank's own slice.
    """
    if not ctx.enabled:
        return model

    if device.startswith("cuda"):
        # The mesh communicates on the current device, which a caller-made process group may not have set.
        torch.cuda.set_device(torch.device(device))
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (ctx.world_size,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor for a (possibly distributed) result such as a sharded model's gradient norm, which
    :func:`torch.nn.utils.clip_grad_norm_` returns as a replicated DTensor of the global norm."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _full_options() -> Any:
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def gather_full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The full (unsharded, CPU) model and optimizer state of a sharded ``model`` on rank 0; empty dicts on
    the other ranks. A collective: every rank must call it.

    The model state is keyed by parameter name (``model.state_dict()``'s keys); the optimizer state has the
    form of ``optimizer.state_dict()`` of the same optimizer over the unsharded model (parameters numbered in
    optimizer order), which is what single-process and DDP checkpoints hold.
    """
    model_state = get_model_state_dict(model, options=_full_options())
    if not optimizer.state:
        # Before the first step there is nothing to gather, and the gathering call would create the state by
        # running a zero-gradient step, which counts as an Adam step on resume.
        optim_state = optimizer.state_dict() if ctx.is_main else {}
        return model_state, optim_state
    by_name = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if not by_name:  # ranks other than 0
        return model_state, {}
    names = [name for group in by_name["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    optim_state = {
        "state": {index[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in by_name["param_groups"]
        ],
    }
    return model_state, optim_state


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a full ``optimizer.state_dict()`` (as saved by one process, DDP, or :func:`gather_full_state`)
    into the optimizer of a sharded ``model``; every rank passes the same full state and keeps its shard."""
    if not state.get("state"):
        # Nothing to shard (a checkpoint from before the first step); this keeps the state empty, whereas the
        # sharded loader would first create one with a zero-gradient step.
        optimizer.load_state_dict(state)
        return
    names = {id(param): name for name, param in model.named_parameters()}
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    if len(order) != sum(len(group["params"]) for group in state["param_groups"]):
        raise ValueError("the saved optimizer state has a different number of parameters than the model")
    by_name = {
        "state": {order[i]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]} for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


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
