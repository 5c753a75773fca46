"""GRAM: generative recursive reasoning with a stochastic high-level latent (Baek et al. 2026).

State ``z = (h, l)``; the input embedding ``e_x`` is computed once. One transition::

    K times   l <- f_L(l, h + e_x)
              u  = f_H(h, l)
              ε ~ N(μ(u), σ²(u))          prior p(ε | u); in training the posterior q(ε | u, y)
              h  = u + ε

A supervision step runs ``T`` transitions (``config.cycles``), the first ``T - 1`` without gradient. Its loss adds
``β · KL(q(ε_T | u_T, y) || p(ε_T | u_T))`` with Dreamer-style balancing ``α = config.kl_balance``:
``α · KL(sg(q) || p) + (1 - α) · KL(q || sg(p))``. The decoder reads ``h``. ``K`` is ``config.inner``.

``config.prior_fraction`` of the rows of a training batch follow the prior instead of the posterior for their
whole trajectory, and pay no KL: the hybrid CVAE objective (Sohn et al. 2015). With the posterior alone the
target can reach the decoder through ``ε`` faster than the prior learns to predict it, so a short training
run may decode perfectly from the posterior and not at all from the prior; prior rows train the decoder on
the noise it sees at inference. ``0`` is the paper's objective.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule

_MIN_STD = 1e-3


class NoiseHead(nn.Module):
    """``(μ, σ)`` of a diagonal Gaussian over ``ε`` from a ``[B, L, dim]`` feature.

    Starts at ``N(0, 0.1²)`` for every input (zero weights), so prior and posterior agree and the KL starts at 0.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        with torch.no_grad():  # softplus(b) + min = 0.1
            self.proj.bias[dim:] = math.log(math.expm1(0.1 - _MIN_STD))

    def forward(self, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, raw = self.proj(feature).float().chunk(2, dim=-1)
        return mu, F.softplus(raw) + _MIN_STD


def gaussian_kl(
    mu_q: torch.Tensor, std_q: torch.Tensor, mu_p: torch.Tensor, std_p: torch.Tensor
) -> torch.Tensor:
    """Elementwise ``KL(N(μ_q, σ_q²) || N(μ_p, σ_p²))``."""
    return torch.log(std_p / std_q) + (std_q**2 + (mu_q - mu_p) ** 2) / (2 * std_p**2) - 0.5


def balanced_kl(
    mu_q: torch.Tensor, std_q: torch.Tensor, mu_p: torch.Tensor, std_p: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Per-sample KL ``[B]`` (summed over latent dims, averaged over positions) with KL balancing: the prior is
    pulled toward the posterior with weight ``alpha``, the posterior toward the prior with ``1 - alpha``."""
    to_prior = gaussian_kl(mu_q.detach(), std_q.detach(), mu_p, std_p)
    to_posterior = gaussian_kl(mu_q, std_q, mu_p.detach(), std_p.detach())
    kl = alpha * to_prior + (1 - alpha) * to_posterior
    return kl.sum(-1).mean(-1)


class GRAMReasoner(Reasoner):
    """f_L and f_H (``n_layers`` blocks each, ending in RMSNorm), a prior and a posterior noise head."""

    arch = "gram"
    stochastic = True

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.f_L = ReasoningModule(config)
        self.f_H = ReasoningModule(config)
        self.prior = NoiseHead(config.dim)
        self.posterior = NoiseHead(config.dim)
        self.target_embed = nn.Embedding(config.vocab_size, config.dim)
        nn.init.normal_(self.target_embed.weight, std=1.0 / math.sqrt(config.dim))
        self.init_state("h_init")
        self.init_state("l_init")

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        x = batch["inputs"]
        carry = {"h": self.broadcast_state("h_init", x), "l": self.broadcast_state("l_init", x)}
        if self.training and self.config.prior_fraction > 0:  # rows whose trajectory follows the prior
            carry["prior_rows"] = torch.rand(x.shape[0], device=x.device) < self.config.prior_fraction
        return carry

    def transition(
        self,
        h: torch.Tensor,
        l: torch.Tensor,  # noqa: E741 - the paper's name
        e_x: torch.Tensor,
        rope: torch.Tensor,
        e_y: torch.Tensor | None,
        prior_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One transition: ``(h, l, kl)``. The posterior is used when the target embedding ``e_y`` is given,
        except on ``prior_rows`` ``[B]`` (bool), which sample the prior and have KL 0."""
        for _ in range(self.config.inner):
            l = self.f_L(l, h + e_x, rope)  # noqa: E741
        u = self.f_H(h, l, rope)
        mu_p, std_p = self.prior(u)
        if e_y is None:
            mu, std, kl = mu_p, std_p, torch.zeros(u.shape[0], device=u.device)
        else:
            mu, std = self.posterior(u + e_y)
            kl = balanced_kl(mu, std, mu_p, std_p, self.config.kl_balance)
            if prior_rows is not None:
                keep = prior_rows[:, None, None]
                mu, std = torch.where(keep, mu_p, mu), torch.where(keep, std_p, std)
                kl = kl.masked_fill(prior_rows, 0.0)
        eps = mu + std * torch.randn_like(std)  # reparameterised: the gradient reaches μ and σ
        return u + eps.to(u.dtype), l, kl

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        e_x, rope = self.embed_input(batch["inputs"])
        e_y = None if target is None else self.target_embed(target.long())
        h, l, prior_rows = carry["h"], carry["l"], carry.get("prior_rows")  # noqa: E741
        with torch.no_grad():
            for _ in range(self.config.cycles - 1):
                h, l, _ = self.transition(h, l, e_x, rope, e_y, prior_rows)  # noqa: E741
        h, l, kl = self.transition(h, l, e_x, rope, e_y, prior_rows)  # noqa: E741
        next_carry = {"h": h.detach(), "l": l.detach()}
        if prior_rows is not None:
            next_carry["prior_rows"] = prior_rows
        return next_carry, self.readout(h, kl)
