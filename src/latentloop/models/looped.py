"""What a looped language model declares about its loop, so that one set of test-time tools serves every one.

A looped LM applies a block of shared layers ``r`` times per token. Generation
(:func:`latentloop.models.generation.generate`), the exit criteria, the KV cache and the harness drive any model
through the same few methods::

    ctx = model.context(length, attention_mask, cache=cache)   # positions, mask and cache of new tokens
    e   = model.embed(input_ids, ctx)                          # what the loop reads: embedding (+ prelude)
    s_0 = model.initialize_state(e, init_scale)                # the loop's first state
    s_i = model.core_step(s_{i-1}, e, ctx, i - 1)               # one pass through the shared layers
    x   = model.head_input(s_r, ctx)                           # what the output layer reads (coda, norm)
    p   = model.predict(s_r, ctx)                              # fp32 logits: model.lm_head(x)

and the config names ``n_heads``, ``head_dim``, ``n_layers_in_recurrent_block``, ``mean_recurrence``,
``block_size`` and ``vocab_size``. Where two models' loops differ, each says so in its :class:`LoopSpec`
(``model.loop``), and tools that depend on the difference read the spec, never the model's name.
:class:`LoopedLM` is that interface as a Protocol: what generation, decoding and the exit criteria are typed
against, and what a new looped LM implements (``RecurrentDepthLM`` and ``OuroLM`` do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@dataclass(frozen=True)
class LoopSpec:
    """The shape of a model's loop.

    - ``prelude`` / ``coda``: layers run once before / after the loop.
    - ``input_injection``: every step reads the token's embedding again (Huginn's adapter on ``[s, e]``);
      without it, the embedding enters only through the initial state.
    - ``random_initial_state``: the loop starts from noise (scaled by ``init_scale``) rather than from the
      embedding, so K trajectories of one prompt differ (width in latent space).
    - ``exit_gate``: a learned gate gives each step an exit probability (``model.exit_lambda(state)``).
    """

    prelude: bool
    coda: bool
    input_injection: bool
    random_initial_state: bool
    exit_gate: bool


@runtime_checkable
class LoopedLM(Protocol):
    """A looped language model, as the test-time tools drive it (see the module docstring)."""

    loop: LoopSpec
    config: Any
    lm_head: nn.Module

    @property
    def embedding(self) -> nn.Embedding:
        """The token embedding (its weight gives the model's device and dtype)."""
        ...

    def context(self, length: int, attention_mask: torch.Tensor | None = None, **where: Any) -> Any:
        """Positions, mask and cache of ``length`` new tokens (``cache=``, ``rows=``, ``start=``, ...)."""
        ...

    def embed(self, input_ids: torch.Tensor, ctx: Any) -> torch.Tensor:
        """What the loop reads: the token embedding, through the prelude where there is one."""
        ...

    def initialize_state(self, embeds: torch.Tensor, init_scale: float = 1.0) -> torch.Tensor:
        """The loop's first state."""
        ...

    def core_step(self, state: torch.Tensor, embeds: torch.Tensor, ctx: Any, iteration: int) -> torch.Tensor:
        """One pass through the shared layers."""
        ...

    def head_input(self, state: torch.Tensor, ctx: Any) -> torch.Tensor:
        """What the output layer reads (coda, norm)."""
        ...

    def predict(self, state: torch.Tensor, ctx: Any) -> torch.Tensor:
        """fp32 logits of the loop's state."""
        ...
