"""GRAM: generative recursive reasoning with a stochastic high-level latent (Baek et al. 2026).

State ``z = (h, l)``; the input embedding ``e_x`` is computed once. One transition::

    K times   l <- f_L(l, h + e_x)
              u  = f_H(h, l)
              ε ~ N(μ(u), σ²(u))          prior p(ε | u); in training the posterior q(ε | u, y)
              h  = u + ε

A supervision step runs ``T`` transitions (``config.cycles``), the first ``T - 1`` without gradient. Its loss adds
``β · KL(q(ε_T | u_T, y) || p(ε_T | u_T))`` with Dreamer-style balancing ``α = config.kl_balance``:
``α · KL(sg(q) || p) + (1 - α) · KL(q || sg(p))``. The decoder reads ``h``. ``K`` is ``config.inner``.

At inference a temperature ``τ`` scales the prior's ``σ`` (``ε ~ N(μ, τ²σ²)``; ``τ = 0`` follows the prior's
mean), the usual dial between the diversity and the validity of a latent-variable model's samples.

The posterior reads ``u + e_y``. ``u`` leaves f_H normalised (RMS 1), so the target embedding is scaled by
``√dim`` as the input embedding is (``config.target_scale = "input"``); unscaled, it reaches the posterior 8
times weaker than ``u`` at dim 64 (``"unscaled"``, the reading of runs trained before the option).

The KL is that of the whole latent ``ε`` (summed over positions and dimensions) while the cross-entropy is a
mean over positions. With the paper's β this prices information in the posterior noise close to what it can
save in cross-entropy (N-Queens 8x8: the posterior pays ``(1 - α) · β = 0.014`` per nat against ``1 / 64``
of cross-entropy saved per nat). A KL averaged over positions instead makes the same β 64 times cheaper: the
posterior then writes the target into ``ε``, training accuracy (which decodes the posterior) reaches 100%
while samples from the prior solve nothing, as measured on N-Queens 8x8.

Which transitions of a training step draw from the posterior is ``config.guided_transitions``. The loss charges
the KL of the last transition only, so with ``all`` (the default) the first ``T - 1`` bring the target into
the state free of charge, and the prior is never taught to make those choices itself (unconditional 6x6
Sudoku at T = 2 trains to a loss below the data's own entropy). ``last`` draws the first ``T - 1`` from the
prior, as inference does, so every nat taken from the target is paid for in the KL. At ``T = 1``, the
time-to-accuracy configs' setting, the two are the same.

Unconditional generation needs one more thing. With the whole target in view, the posterior writes most of
a board into the noise of the first step (measured on 6x6 Sudoku: 44 nats of KL there, against 17 nats in a
whole board), and a prior that draws each cell independently cannot match it. ``config.target_reveal = N``
lets the posterior see each target cell only from a random one of the first ``N`` supervision steps on,
drawn once per sample, as a masked diffusion model unmasks its cells, so the target enters over the steps
and the prior has each step's choices to learn given those made before (measured in docs/reasoners.md,
"Unconditional samples"). This is latentloop's option, not the paper's.

Training decodes posterior noise and inference prior noise, and a small model can lean on the posterior so
much that its training accuracy says little about its samples (N-Queens 10x10: 65-75% of the training puzzles
solved with the posterior, 3-4% of the held-out ones with one sample from the prior). ``config.prior_share = s``
trains a share ``s`` of the samples, drawn once per sample, on the prior's noise for their whole trajectory, as
inference runs, with no KL charged: the remedy of the conditional VAE's authors (Sohn et al. 2015, "Learning
Structured Output Representation using Deep Conditional Generative Models"), whose hybrid objective mixes the
CVAE's loss with that of the same network fed prior noise (their GSNN). Also latentloop's option. The share is
of the samples drawn, not of the updates: under ``train.replace_halted`` a sample leaves when its answer is
right, which a prior-noise sample reaches later, so those samples hold their slots longer and take more than
a share ``s`` of the updates.

Training the prior where it is used (latentloop's options; the paper's reading is the default of each). In the
paper's training every supervision step starts from the posterior's state, the halt and value heads learn
from it, and only the posterior's sample is decoded; at inference the prior's trajectory is the only one, so
its states, its answers and its halting are never what training saw. ``config.carry = "prior"`` carries the
prior's sample of each step to the next (the posterior's sample of the same ``u`` is still what the loss
decodes and the KL prices), so the posterior teaches from the states the prior reaches; with
``train.nearest_target`` its target is then the valid answer nearest to the one the prior's state decodes
to, so it finishes what the prior began. ``config.heads = "prior"`` has the halt and value heads read the
prior's sample, detached, and learn the task verifier's verdict on its answer, so halting during training
(``train.replace_halted``) is keyed to the prior, as at inference. ``config.prior_ce = w`` adds ``w`` times
the cross-entropy of the prior's decode. ``config.noise_head = "swiglu"`` reads Table 4 as a SwiGLU MLP per
noise parameter with ``σ`` bounded at 1. ``config.kl_reduce = "mean"`` averages the KL over the latent's
``L`` positions instead of summing it: ``β · L`` then prices a nat as the summed KL's ``β`` does.

The paper's ablation (Section 4.4: full model; "without stochastic guidance"; "stochasticity only") is
``config.guidance``. The excerpt names the variants without defining them; the readings here:

- ``posterior`` (the full model): training draws ``ε`` from the posterior ``q(ε | u, y)``, inference from the
  prior ``p(ε | u)``, and the loss adds the KL between them.
- ``prior`` ("without stochastic guidance": the target no longer guides the noise): no posterior and no target
  embedding. Training draws ``ε`` from the learned prior ``p(ε | u)`` as inference does, so ``μ`` and ``σ``
  learn only through the reparameterised cross-entropy, and the KL is 0.
- ``none`` ("stochasticity only": noise without any learned guidance): no noise heads at all. Training and
  inference draw ``ε ~ N(0, σ₀²)`` with the fixed ``σ₀ = 0.1`` (the noise heads' starting ``σ``), whatever
  ``u`` is; the temperature scales ``σ₀`` at inference as it scales the prior's ``σ``. The KL is 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.data.labels import label_tokens
from latentloop.errors import UsageError
from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule
from latentloop.nn.mlp import GatedMLP

_MIN_STD = 1e-3
#: σ₀ of ``guidance="none"``: the noise heads' starting σ, so the variants start from the same noise.
FIXED_STD = 0.1


class NoiseHead(nn.Module):
    """``(μ, σ)`` of a diagonal Gaussian over ``ε`` from a ``[B, L, dim]`` feature.

    ``kind="linear"``: one linear layer, ``σ = softplus(·) + 10⁻³``, unbounded above. ``kind="swiglu"``: the
    paper's Table 4, a SwiGLU MLP for each parameter (hidden ``hidden``), ``σ = 10⁻³ + (1 - 10⁻³) · sigmoid(·)``,
    so σ stays in (0, 1]: the prior's noise can never drown the normalised state. Either starts at
    ``N(0, 0.1²)`` for every input (zero output weights), so prior and posterior agree and the KL starts at 0.
    """

    def __init__(self, dim: int, kind: str = "linear", hidden: int = 0) -> None:
        super().__init__()
        self.kind = kind
        if kind == "linear":
            self.proj = nn.Linear(dim, 2 * dim)
            outputs = [self.proj]
        else:
            self.mu, self.sigma = (
                GatedMLP(dim, hidden or dim, bias=True),
                GatedMLP(dim, hidden or dim, bias=True),
            )
            outputs = [self.mu.proj, self.sigma.proj]
        for layer in outputs:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        with torch.no_grad():  # σ = 0.1 at the start
            if kind == "linear":
                self.proj.bias[dim:] = math.log(math.expm1(FIXED_STD - _MIN_STD))
            else:
                self.sigma.proj.bias.fill_(math.log((FIXED_STD - _MIN_STD) / (1 - FIXED_STD)))

    def forward(self, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "linear":
            mu, raw = self.proj(feature).float().chunk(2, dim=-1)
            return mu, F.softplus(raw) + _MIN_STD
        mu, raw = self.mu(feature).float(), self.sigma(feature).float()
        return mu, _MIN_STD + (1 - _MIN_STD) * torch.sigmoid(raw)


def gaussian_kl(
    mu_q: torch.Tensor, std_q: torch.Tensor, mu_p: torch.Tensor, std_p: torch.Tensor
) -> torch.Tensor:
    """Elementwise ``KL(N(μ_q, σ_q²) || N(μ_p, σ_p²))``."""
    return torch.log(std_p / std_q) + (std_q**2 + (mu_q - mu_p) ** 2) / (2 * std_p**2) - 0.5


def balanced_kl(
    mu_q: torch.Tensor,
    std_q: torch.Tensor,
    mu_p: torch.Tensor,
    std_p: torch.Tensor,
    alpha: float,
    reduce: str = "sum",
) -> torch.Tensor:
    """Per-sample KL ``[B]`` with KL balancing: the prior is pulled toward the posterior with weight ``alpha``,
    the posterior toward the prior with ``1 - alpha``. ``reduce="sum"``: the KL of the whole latent (summed over
    positions and dims); ``"mean"``: summed over dims and averaged over positions."""
    to_prior = gaussian_kl(mu_q.detach(), std_q.detach(), mu_p, std_p)
    to_posterior = gaussian_kl(mu_q, std_q, mu_p.detach(), std_p.detach())
    kl = (alpha * to_prior + (1 - alpha) * to_posterior).sum(-1)
    return kl.flatten(1).sum(-1) if reduce == "sum" else kl.flatten(1).mean(-1)


class GRAMReasoner(Reasoner):
    """f_L and f_H (``n_layers`` blocks each, ending in RMSNorm) and the noise of ``config.guidance``: a prior
    and a posterior noise head (posterior), the prior alone (prior) or none (none)."""

    arch = "gram"
    stochastic = True

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.f_L = ReasoningModule(config)
        self.f_H = ReasoningModule(config)
        # The ablations lack the parts they ablate, so no optimizer step or weight decay can touch them.
        heads = {"dim": config.dim, "kind": config.noise_head, "hidden": config.hidden}
        self.prior = NoiseHead(**heads) if config.guidance != "none" else None
        self.posterior = NoiseHead(**heads) if config.guidance == "posterior" else None
        self.target_embed = None
        if config.guidance == "posterior":
            self.target_embed = nn.Embedding(config.vocab_size, config.dim)
            nn.init.normal_(self.target_embed.weight, std=1.0 / math.sqrt(config.dim))
        self.init_state("h_init")
        self.init_state("l_init")

    @classmethod
    def posterior_in(cls, config: ReasonerConfig) -> bool:
        return config.guidance == "posterior"

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        x = batch["inputs"]
        carry = {"h": self.broadcast_state("h_init", x), "l": self.broadcast_state("l_init", x)}
        if self.config.target_reveal:  # the supervision step at which the posterior first sees each cell
            reveal = torch.randint(
                self.config.target_reveal, (x.shape[0], self.config.positions), device=x.device
            )
            carry |= {"reveal_at": reveal, "step": torch.zeros(x.shape[0], dtype=torch.long, device=x.device)}
        if self.config.prior_share:  # the samples that train on the prior's noise, drawn once per sample
            carry["unguided"] = torch.rand(x.shape[0], device=x.device) < self.config.prior_share
        return carry

    def transition(
        self,
        h: torch.Tensor,
        l: torch.Tensor,  # noqa: E741 - the paper's name
        e_x: torch.Tensor,
        rope: torch.Tensor,
        e_y: torch.Tensor | None,
        temperature: float = 1.0,
        unguided: torch.Tensor | None = None,
        with_prior: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One transition: ``(h, l, kl, h_prior)``; the posterior is used when the target embedding ``e_y`` is
        given, the prior's ``σ`` (or the fixed ``σ₀`` of ``guidance="none"``) scaled by ``temperature``
        otherwise. The rows marked ``unguided`` ([B] bool) draw from the prior even when ``e_y`` is given, and
        their KL is 0. ``h_prior`` is ``u`` plus a second draw, from the prior, beside the posterior's when
        ``with_prior`` and ``e_y`` are given; ``h`` itself otherwise."""
        for _ in range(self.config.inner):
            l = self.f_L(l, h + e_x, rope)  # noqa: E741
        u = self.f_H(h, l, rope)
        kl = torch.zeros(u.shape[0], device=u.device)
        mu_p = std_p = None
        if self.prior is None:  # stochasticity only: N(0, σ₀²) whatever u is
            mu = torch.zeros(u.shape, device=u.device)
            std = torch.full(u.shape, FIXED_STD * temperature, device=u.device)
        else:
            mu_p, std_p = self.prior(u)
            if e_y is None:
                mu, std = mu_p, std_p * temperature
            else:
                assert self.posterior is not None
                mu, std = self.posterior(u + e_y)
                kl = balanced_kl(mu, std, mu_p, std_p, self.config.kl_balance, self.config.kl_reduce)
                if unguided is not None:
                    rows = unguided.view(-1, *[1] * (u.dim() - 1))
                    mu, std = torch.where(rows, mu_p, mu), torch.where(rows, std_p, std)
                    kl = kl.masked_fill(unguided, 0.0)
        eps = mu + std * torch.randn_like(std)  # reparameterised: the gradient reaches μ and σ
        h = u + eps.to(u.dtype)
        if not with_prior or e_y is None or mu_p is None:
            return h, l, kl, h
        eps_prior = mu_p + std_p * temperature * torch.randn_like(std_p)
        return h, l, kl, u + eps_prior.to(u.dtype)

    def forward(  # type: ignore[override]
        self,
        carry: Carry,
        batch: dict[str, torch.Tensor],
        target: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> tuple[Carry, ReasonerOutput]:
        """One supervision step; without ``target`` (or without a posterior, ``config.guidance`` prior or
        none) the noise comes from the prior, or the fixed noise, at ``temperature``."""
        if temperature < 0:
            raise UsageError(f"temperature must be >= 0, got {temperature}")
        e_x, rope = self.embed_input(batch["inputs"], batch.get("puzzle_ids"))
        e_y = None
        if target is not None and self.target_embed is not None:
            e_y = self.target_embed(label_tokens(target).long())
            if self.config.target_scale == "input":
                e_y = e_y * math.sqrt(self.config.dim)
        if e_y is not None and self.config.prefix_len:  # the puzzle-embedding positions have no target
            e_y = F.pad(e_y, (0, 0, self.config.prefix_len, 0))
        per_sample = {}  # what each sample keeps from step to step besides the state
        if "reveal_at" in carry:
            if e_y is not None:
                e_y = e_y * (carry["reveal_at"] <= carry["step"][:, None]).unsqueeze(-1).to(e_y.dtype)
            per_sample = {"reveal_at": carry["reveal_at"], "step": carry["step"] + 1}
        if "unguided" in carry:
            per_sample["unguided"] = carry["unguided"]
        unguided = carry.get("unguided") if e_y is not None else None
        h, l = carry["h"], carry["l"]  # noqa: E741
        config = self.config
        # Training along the prior's trajectory: its earlier transitions draw from the prior, as inference does.
        e_y_early = e_y if config.guided_transitions == "all" and config.carry == "posterior" else None
        with torch.no_grad():
            for _ in range(config.cycles - 1):
                h, l, _, _ = self.transition(h, l, e_x, rope, e_y_early, temperature, unguided)  # noqa: E741
        with_prior = e_y is not None and config.trains_prior_path
        h, l, kl, h_prior = self.transition(h, l, e_x, rope, e_y, temperature, unguided, with_prior)  # noqa: E741
        out = self.readout(
            h, kl, head_state=h_prior.detach() if with_prior and config.heads == "prior" else None
        )
        if with_prior:
            with torch.set_grad_enabled(torch.is_grad_enabled() and config.prior_ce > 0):
                out.prior_logits = self.logits_of(h_prior)
        carried = h_prior if config.carry == "prior" else h
        return {"h": carried.detach(), "l": l.detach(), **per_sample}, out
