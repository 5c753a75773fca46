"""KV cache for the recurrent-depth LM: one slot per (layer, core iteration), optionally shared.

Prelude and coda layers own one slot each. Each core layer has one slot per iteration; with a budget of
``kv_share = k`` slots, iteration ``i`` reads and writes slot ``i mod k`` so memory stops growing with depth.
A token that exited early never writes the slots of its skipped iterations; those keep the deepest
iteration of the same residue it did compute (or, where it never reached that residue, its deepest one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from latentloop.nn import KVHook


@dataclass(frozen=True)
class LayerKey:
    """Identifies a cache slot: ``part`` is prelude, core or coda; ``slot`` is only used for the core."""

    part: str
    layer: int
    slot: int = 0


class RecurrentKVCache:
    """Pre-sized key/value buffers ``[B, heads, capacity, head_dim]`` allocated on first write."""

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        head_dim: int,
        capacity: int,
        kv_share: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if kv_share is not None and kv_share < 1:
            raise ValueError(f"kv_share must be a positive number of slots, got {kv_share}")
        self.batch_size = batch_size
        self.shape = (batch_size, n_heads, capacity, head_dim)
        self.capacity = capacity
        self.kv_share = kv_share
        self.dtype = dtype
        self.device = torch.device(device)
        self.length = 0  # positions committed so far
        self.keys: dict[LayerKey, torch.Tensor] = {}
        self.values: dict[LayerKey, torch.Tensor] = {}

    def slot(self, iteration: int) -> int:
        """The core slot used by ``iteration`` (0-based)."""
        return iteration if self.kv_share is None else iteration % self.kv_share

    def core_slots(self) -> list[int]:
        """Slots written so far by the core (sorted)."""
        return sorted({key.slot for key in self.keys if key.part == "core"})

    def _buffers(self, key: LayerKey) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.keys:
            self.keys[key] = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            self.values[key] = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        return self.keys[key], self.values[key]

    def hook(self, key: LayerKey, start: int, rows: torch.Tensor | None = None):
        """A KV hook that writes positions ``start..start+S`` of ``key`` (only ``rows`` if given) and
        returns keys and values of positions ``0..start+S``."""

        def update(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            end = start + k.shape[2]
            if end > self.capacity:
                raise ValueError(f"KV cache capacity {self.capacity} exceeded (position {end})")
            key_buf, value_buf = self._buffers(key)
            k, v = k.to(self.dtype), v.to(self.dtype)
            if rows is None:
                key_buf[:, :, start:end] = k
                value_buf[:, :, start:end] = v
            else:
                keep = rows[:, None, None, None]
                key_buf[:, :, start:end] = torch.where(keep, k, key_buf[:, :, start:end])
                value_buf[:, :, start:end] = torch.where(keep, v, value_buf[:, :, start:end])
            return key_buf[:, :, :end], value_buf[:, :, :end]

        return update

    def fill_skipped(self, rows: torch.Tensor, position: int, iterations_done: int) -> None:
        """After ``rows`` exited at ``position`` having run ``iterations_done`` core iterations, give every
        core slot they never wrote at that position the keys and values of their deepest iteration."""
        if iterations_done < 1:
            return
        deepest = self.slot(iterations_done - 1)
        written = {self.slot(i) for i in range(iterations_done)}
        keep = rows[:, None, None]
        for key in list(self.keys):
            if key.part != "core" or key.slot in written:
                continue
            src = LayerKey("core", key.layer, deepest)
            for store in (self.keys, self.values):
                store[key][:, :, position] = torch.where(
                    keep, store[src][:, :, position], store[key][:, :, position]
                )

    def ensure_slots(self, n_layers: int, iterations: int) -> None:
        """Allocate the core slots that ``iterations`` will use, so skipped ones can be filled."""
        for layer in range(n_layers):
            for i in range(iterations):
                self._buffers(LayerKey("core", layer, self.slot(i)))

    def advance(self, n: int) -> None:
        """Commit ``n`` newly written positions."""
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget positions from ``length`` on (speculative decoding rejects a draft's tail)."""
        self.length = min(self.length, length)

    def nbytes(self) -> int:
        """Bytes held by all key and value buffers."""
        return sum(t.numel() * t.element_size() for store in (self.keys, self.values) for t in store.values())


class DecodeSlots:
    """The cache buffers of one decoding step, picked out of a :class:`RecurrentKVCache` beforehand.

    A compiled step sees only tensors of fixed shapes: one full-capacity (key, value) pair per layer (the core's
    those of ``iteration``'s slot), and the position to write as a tensor, so one compiled graph serves every
    token, iteration and slot. Attention then reads the whole buffer, so the caller masks the positions not
    yet written.
    """

    def __init__(self, cache: RecurrentKVCache, iteration: int, position: torch.Tensor) -> None:
        slot = cache.slot(iteration)
        self.buffers = {
            (key.part, key.layer): (cache.keys[key], cache.values[key])
            for key in cache.keys
            if key.part != "core" or key.slot == slot
        }
        self.position = position

    def slot(self, iteration: int) -> int:
        """Every iteration maps to the buffers chosen at construction."""
        return 0

    def hook(self, key: LayerKey, start: int, rows: torch.Tensor | None = None) -> KVHook:
        """A KV hook that writes this step's keys and values (of ``rows`` only, if given) at ``position`` and
        returns the whole buffers."""
        key_buf, value_buf = self.buffers[(key.part, key.layer)]
        position = self.position

        def update(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            k, v = k.to(key_buf.dtype), v.to(value_buf.dtype)
            if rows is not None:
                keep = rows[:, None, None, None]
                k = torch.where(keep, k, key_buf.index_select(2, position))
                v = torch.where(keep, v, value_buf.index_select(2, position))
            key_buf.index_copy_(2, position, k)
            value_buf.index_copy_(2, position, v)
            return key_buf, value_buf

        return update
