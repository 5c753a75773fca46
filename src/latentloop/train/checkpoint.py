"""Run folders and checkpoints.

Layout of a run folder ``OUT/``::

    OUT/config.yaml                        the full run config (model, train, task)
    OUT/metrics.jsonl                      one JSON object per logged step / evaluation
    OUT/checkpoints/step_00000500/
        config.json, model.safetensors     the model, huginn-0125 layout (RecurrentDepthLM.save_pretrained)
        optimizer.pt                       {"optimizer": state_dict, "torch_rng_state": uint8 tensor,
                                            "rank_rng": one entry of RNG states per rank}
        trainer_state.json                 step (which is also the data position: a step's batch is a pure
                                           function of (seed, step)), tokens seen, python and numpy RNG states

A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXXX-PID``, every file is flushed to disk, and only
then is the folder renamed, so a folder named ``step_XXXXXXXX`` is complete unless something damaged it later;
damage is reported as a one-line :class:`~latentloop.errors.UsageError` when it is loaded. Older checkpoints
are pruned only after the new one is in place, so a crash at any moment leaves the last complete one. Nothing
is unpickled: weights are safetensors and ``optimizer.pt`` is read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentloop.errors import UsageError
from latentloop.io import atomic_write_text

CHECKPOINTS = "checkpoints"
FILES = ("config.json", "model.safetensors", "optimizer.pt", "trainer_state.json")
_NAME = re.compile(r"step_(\d{8})")


def checkpoint_name(step: int) -> str:
    """``step_00000500`` for step 500 (zero-padded so names sort by step)."""
    return f"step_{int(step):08d}"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders of a run (all files present), oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.fullmatch(path.name)
        if match and path.is_dir() and all((path / f).is_file() for f in FILES):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or ``None`` when it has none."""
    checkpoints = list_checkpoints(out_dir)
    return checkpoints[-1] if checkpoints else None


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint folder (a model ``config.json`` beside ``model.safetensors``)."""
    path = Path(path)
    return (path / "config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    )


def resolve_checkpoint(run_or_checkpoint: str | Path) -> Path:
    """A checkpoint folder given itself or its run folder (then the newest one); one-line errors otherwise."""
    path = Path(run_or_checkpoint)
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    if is_checkpoint(path):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise UsageError(f"{path} is neither a checkpoint nor a run folder with a complete checkpoint")
    return latest


def run_folder_of(checkpoint: str | Path) -> Path | None:
    """The run folder that holds ``checkpoint`` (``OUT`` for ``OUT/checkpoints/step_X``), if it is one."""
    checkpoint = Path(checkpoint).resolve()
    if checkpoint.parent.name == CHECKPOINTS and (checkpoint.parent.parent / "config.yaml").is_file():
        return checkpoint.parent.parent
    return None


# RNG state --------------------------------------------------------------------------------------------------
def capture_rng_state() -> dict[str, Any]:
    """Python and NumPy global RNG states as JSON-able data (torch's goes beside the optimizer as a tensor)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def capture_rank_rng() -> dict[str, Any]:
    """This process's torch (CPU and current CUDA device), Python and NumPy RNG states, in a form that
    ``torch.load(weights_only=True)`` reads back (tensors, lists, numbers)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), **capture_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_training_rng(
    state: dict[str, Any], torch_state: torch.Tensor | None, rank: int = 0, world_size: int = 1
) -> None:
    """Restore the RNG states a checkpoint saved for this process: its own rank's when the checkpoint was
    written by as many processes, else rank 0's (every rank draws the same numbers, so rank 0's state is the
    state of any rank at that step, whatever the process count)."""
    ranks = state.get("rank_rng")
    if isinstance(ranks, list) and ranks:
        mine = ranks[rank] if len(ranks) == world_size else ranks[0]
        if not isinstance(mine, dict) or not isinstance(mine.get("torch"), torch.Tensor):
            raise UsageError("checkpoint is corrupt: optimizer.pt has a malformed per-rank RNG state")
        restore_rng_state(mine, mine["torch"])
        cuda = mine.get("cuda")
        if isinstance(cuda, torch.Tensor) and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda)
        return
    restore_rng_state(state["rng"], torch_state)


def restore_rng_state(state: dict[str, Any], torch_state: torch.Tensor | None = None) -> None:
    """Inverse of :func:`capture_rng_state` (and ``torch.set_rng_state`` when ``torch_state`` is given)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if torch_state is not None:
        torch.set_rng_state(torch_state)


# Save / load ------------------------------------------------------------------------------------------------
def save_checkpoint(
    out_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    keep: int = 2,
    rank_rng: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``OUT/checkpoints/step_XXXXXXXX`` atomically (temporary folder, then rename) and keep the newest
    ``keep`` checkpoints (``keep <= 0`` keeps all). ``trainer_state`` gets the step and RNG states added;
    ``rank_rng`` (from :func:`capture_rank_rng` on every rank) goes into ``optimizer.pt``."""
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    temp = root / f".tmp-{final.name}-{os.getpid()}"
    if temp.exists():
        shutil.rmtree(temp)
    try:
        model.save_pretrained(temp)  # type: ignore[operator]
        saved: dict[str, Any] = {
            "optimizer": optimizer.state_dict(),
            "torch_rng_state": torch.get_rng_state(),
        }
        if rank_rng is not None:
            saved["rank_rng"] = rank_rng
        torch.save(saved, temp / "optimizer.pt")
        state = {**trainer_state, "step": int(step), "rng": capture_rng_state()}
        atomic_write_text(temp / "trainer_state.json", json.dumps(state))
        for file in FILES:  # flush file contents before the rename publishes the folder
            with open(temp / file, "rb") as stream:
                os.fsync(stream.fileno())
        old = root / f".old-{final.name}-{os.getpid()}"
        if final.exists():
            # A damaged folder of the same step: move it aside rather than delete it first, so that no moment
            # exists at which neither it nor the new one is there.
            os.replace(final, old)
        os.replace(temp, final)
        _fsync_dir(root)  # make the rename itself durable before older checkpoints are pruned
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)
    prune_checkpoints(out_dir, keep)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def prune_checkpoints(out_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints, and temporary folders of crashed saves."""
    root = Path(out_dir) / CHECKPOINTS
    stale_folders = [*root.glob(".tmp-step_*"), *root.glob(".old-step_*")]
    for stale in stale_folders:
        pid = stale.name.rsplit("-", 1)[-1]
        if pid != str(os.getpid()):
            shutil.rmtree(stale, ignore_errors=True)
    if keep > 0:
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def read_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint, with a one-line error when it is missing or damaged."""
    file = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(file.read_text())
    except FileNotFoundError:
        raise UsageError(f"checkpoint {checkpoint} is incomplete: trainer_state.json is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"checkpoint {checkpoint} is corrupt: trainer_state.json: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise UsageError(f"checkpoint {checkpoint} is corrupt: trainer_state.json has no step")
    return state


def load_training_state(
    checkpoint: str | Path, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Load ``optimizer.pt`` into ``optimizer``; return the trainer state and the saved torch RNG state."""
    checkpoint = Path(checkpoint)
    state = read_trainer_state(checkpoint)
    file = checkpoint / "optimizer.pt"
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(saved["optimizer"])
    except FileNotFoundError:
        raise UsageError(f"checkpoint {checkpoint} is incomplete: optimizer.pt is missing") from None
    except Exception as error:  # torch raises many types (RuntimeError, pickle errors, EOFError, ...)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"checkpoint {checkpoint} is corrupt: optimizer.pt: {reason}") from None
    rng = state.get("rng")
    if not isinstance(rng, dict) or not {"python", "numpy"} <= set(rng):
        raise UsageError(f"checkpoint {checkpoint} is corrupt: trainer_state.json has no RNG state")
    torch_state = saved.get("torch_rng_state") if isinstance(saved, dict) else None
    if isinstance(saved, dict) and saved.get("rank_rng") is not None:
        state["rank_rng"] = saved["rank_rng"]  # in memory only; see restore_training_rng
    return state, torch_state if isinstance(torch_state, torch.Tensor) else None
