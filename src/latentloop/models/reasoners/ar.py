"""Autoregressive baseline: a causal transformer that reads the input grid and writes the output grid.

The sequence is ``[x_1 .. x_L, SEP, y_1 .. y_L]`` with rotary positions ``0 .. 2L``; the state at position
``L + i`` (``SEP`` for ``i = 0``) predicts ``y_{i+1}``::

    p(y | x) = prod_i p(y_i | x, y_<i)                         (next-token factorisation)
    loss     = -(1/L) sum_i log p(y_i | x, y_<i)                teacher forcing, every output position

Every output position is scored, padding included (an unscored label is read as the pad token it is stored
as, :func:`~latentloop.data.labels.label_tokens`): at inference the model writes its own pads, and a pad it
never learned to write would condition the tokens after it on something unseen in training.

A supervision step with a target is one teacher-forced pass (the trainer runs it as ``n_sup = 1``); without a
target it decodes greedily. :meth:`ARReasoner.sample` is the sampler :func:`latentloop.infer.scaling.solve`
calls: K samples of every puzzle as one batch, decoded left to right with a KV cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.data.labels import label_tokens
from latentloop.errors import UsageError
from latentloop.models.reasoners.base import (
    Carry,
    Reasoner,
    ReasonerConfig,
    ReasonerOutput,
    rotary_embedding,
)
from latentloop.nn import BLOCKS, RMSNorm


def draw(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Token ids ``[...]`` from ``logits`` ``[..., V]``: argmax at temperature 0, else a draw from
    ``softmax(logits / temperature)`` (torch's global RNG, so a seeded run repeats)."""
    if temperature < 0:
        raise UsageError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).view(probs.shape[:-1])


def geometric_mean_prob(log_probs: torch.Tensor) -> torch.Tensor:
    """``exp(mean log p)`` over the last axis: the per-token likelihood a generator gives its own answer,
    in (0, 1]. It is the value the generative baselines rank samples by (the value head never sees a wrong
    answer in teacher-forced or masked training, so it cannot)."""
    return log_probs.float().mean(-1).exp()


class KVCache:
    """The keys and values one attention layer has seen, as a ``kv_hook``: append this call's, return all."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __call__(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class ARReasoner(Reasoner):
    """``n_layers`` causal blocks over ``[x ; SEP ; y]``; the shared embedding, lm_head and heads of
    :class:`Reasoner`. Decoding with :meth:`sample` needs one step (``steps`` 1)."""

    arch = "ar"
    generative = True

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        c = config
        if c.mixer != "attention":
            raise UsageError("the ar model needs model.mixer=attention (it decodes with causal attention)")
        if c.pos_encoding != "rope":  # its answer positions continue the input's rotary positions
            raise UsageError("the ar model needs model.pos_encoding=rope")
        # Rotations for the concatenation: L input positions, SEP, and L - 1 fed-back output tokens. With
        # model.rope_grid the position predicting output cell i is cell i of a second grid below the input's.
        self.rope = rotary_embedding(c, 2 * c.seq_len)
        self.sep = nn.Parameter(torch.randn(c.dim))  # unit RMS, like the scaled token embeddings
        self.layers = nn.ModuleList(
            BLOCKS[c.block](c.dim, c.n_heads, c.hidden, c.norm_eps) for _ in range(c.n_layers)
        )
        self.final_norm = RMSNorm(c.dim, c.norm_eps) if c.block == "pre-norm" else None

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        return {}

    # -- the transformer ---------------------------------------------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Output tokens embedded like the input (the shared table, scaled to unit RMS)."""
        return self.embed(tokens.long()) * math.sqrt(self.config.dim)

    def run(self, h: torch.Tensor, start: int, caches: list[KVCache] | None = None) -> torch.Tensor:
        """The causal stack on embeddings ``h`` ``[B, S, dim]`` at positions ``start .. start + S - 1``;
        ``caches`` (one per layer) hold the earlier positions' keys and values."""
        rope = self.rope.tables(torch.arange(start, start + h.shape[1], device=h.device))
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, causal=True, kv_hook=None if caches is None else caches[i])
        return self.final_norm(h) if self.final_norm is not None else h

    def prefix(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[e_x ; SEP]`` ``[B, L + 1, dim]``: what every output is conditioned on."""
        e_x, _ = self.embed_input(inputs)
        return torch.cat([e_x, self.sep.to(e_x.dtype).expand(e_x.shape[0], 1, -1)], dim=1)

    # -- training ----------------------------------------------------------------------------------------------
    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        """With ``target``: one teacher-forced pass, ``out.loss`` the per-sample next-token CE. Without: greedy
        decoding, ``out.logits`` the logits each chosen token was the argmax of."""
        inputs = batch["inputs"]
        length = self.config.seq_len
        if target is None:
            target, _ = self.decode(inputs, temperature=0.0)
        else:
            target = label_tokens(target)
        h = torch.cat([self.prefix(inputs), self.embed_tokens(target[:, :-1])], dim=1)  # [B, 2L, dim]
        out = self.readout(self.run(h, 0)[:, length:])  # states at SEP, y_1 .. y_{L-1}
        token_nll = F.cross_entropy(out.logits.float().transpose(1, 2), target.long(), reduction="none")
        out.loss = token_nll.mean(-1)
        return {}, out

    # -- inference ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(
        self, inputs: torch.Tensor, temperature: float = 1.0, use_cache: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [B, L], log-probs [B, L])``: the output written left to right, each token drawn at
        ``temperature`` (0: greedy). ``use_cache=False`` recomputes the whole prefix at every position (the
        reference the cached decoding must equal)."""
        length = self.config.seq_len
        prefix = self.prefix(inputs)
        caches = [KVCache() for _ in self.layers] if use_cache else None
        h = self.run(prefix, 0, caches)
        tokens, log_probs = [], []
        for i in range(length):
            logits = self.lm_head(h[:, -1]).float()
            token = draw(logits, temperature)
            tokens.append(token)
            log_probs.append(F.log_softmax(logits, -1).gather(-1, token[:, None]).squeeze(-1))
            if i == length - 1:
                break
            e_y = self.embed_tokens(token[:, None]).to(prefix.dtype)
            if caches is not None:
                h = self.run(e_y, length + 1 + i, caches)
            else:
                prefix = torch.cat([prefix, e_y], dim=1)
                h = self.run(prefix, 0)
        return torch.stack(tokens, 1), torch.stack(log_probs, 1)

    @torch.no_grad()
    def sample(
        self, inputs: torch.Tensor, steps: int | None = None, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampler of :func:`~latentloop.infer.scaling.solve`: ``(tokens [1, N, L], values [1, N])`` for
        ``inputs`` ``[N, L]`` (the K repeats of a batch side by side). Left-to-right decoding is one step, so
        ``steps`` must be ``None`` or 1; the value is :func:`geometric_mean_prob` of the sample."""
        if steps not in (None, 1):
            raise UsageError(f"the ar model decodes in one left-to-right pass: steps must be 1, got {steps}")
        tokens, log_probs = self.decode(inputs, temperature)
        return tokens[None], geometric_mean_prob(log_probs)[None]
