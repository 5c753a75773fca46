"""MDLM baseline: masked (absorbing-state) diffusion over the output grid, conditioned on the input.

Forward process: each output token ``y_l`` is independently replaced by the mask ``m`` with probability
``1 - α_t``, the log-linear schedule ``α_t = 1 - t`` for ``t`` in [0, 1]. A denoiser ``x_θ(z_t, x)`` predicts
the clean tokens. The continuous-time NELBO (Sahoo et al. 2024, MDLM) per sample, normalised by ``L``::

    loss = E_t [ (-α'_t / (1 - α_t)) · (1/L) sum_{l masked in z_t} -log x_θ(z_t, x)_l[y_l] ]
         = E_t [ (1/t) · (1/L) sum_{l masked} CE_l ]                       (log-linear schedule)

Conditioning: the grids are aligned position by position, so the denoiser is the reasoners' bidirectional
:class:`ReasoningModule` applied to ``e(z_t) + e_x`` (the input embedding added to the output positions, no
concatenation); a masked position gets a learned mask embedding. There is no time input: the share of masks
in ``z_t`` already tells the denoiser how far along it is. Every position is scored, padding included (an
unscored label is read as the pad token, :func:`~latentloop.data.labels.label_tokens`), as the sampler writes
every position.

Reverse process (ancestral sampling, MDLM eq. for ``s < t``): a masked token is revealed with probability
``(α_s - α_t) / (1 - α_t) = (t - s) / t``, drawn from ``x_θ`` (at ``temperature``); a revealed token is carried
over unchanged. :meth:`MDLMReasoner.sample` runs ``steps`` such updates on the grid ``t_k = 1 - k / steps``,
starting all masked; the last (``s = 0``) reveals whatever is left. Which tokens a step reveals is random,
not confidence-ordered: that is the model's reverse process.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.data.labels import label_tokens
from latentloop.errors import UsageError
from latentloop.models.reasoners.ar import draw, geometric_mean_prob
from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule

MASK = -1  # the absorbing state in token tensors (never an index into the vocabulary)
T_MIN = 1e-3  # the smallest training time: the weight 1/t stays finite


def alpha(t: torch.Tensor) -> torch.Tensor:
    """``α_t = 1 - t``: the probability that a token is still unmasked at time ``t``."""
    return 1 - t


def loss_weight(t: torch.Tensor) -> torch.Tensor:
    """``-α'_t / (1 - α_t) = 1 / t``: the NELBO's weight on the CE of a masked token at time ``t``."""
    return 1 / t


def mdlm_loss(
    logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """The per-sample loss ``[B]``: ``loss_weight(t) · (1/L) · sum of CE over masked positions``.

    ``logits`` ``[B, L, V]``, ``labels`` ``[B, L]``, ``masked`` ``[B, L]`` (bool), ``t`` ``[B]``.
    """
    token_nll = F.cross_entropy(logits.float().transpose(1, 2), labels.long(), reduction="none")
    return loss_weight(t) * (token_nll * masked).sum(-1) / labels.shape[1]


def sample_times(batch: int, device: torch.device | str) -> torch.Tensor:
    """Training times ``[B]`` in ``[T_MIN, 1)``: one uniform draw spread evenly over the batch (MDLM's
    low-discrepancy sampler, ``t_i = (u + i / B) mod 1``), which lowers the variance of the loss."""
    u = torch.rand((), device=device)
    t = (u + torch.arange(batch, device=device) / batch) % 1
    return T_MIN + (1 - T_MIN) * t


def unmask(z: torch.Tensor, logits: torch.Tensor, t: float, s: float, temperature: float) -> torch.Tensor:
    """One reverse step ``z_t -> z_s``: each masked position is revealed with probability ``(t - s) / t``,
    its token drawn from ``logits`` at ``temperature``; positions already revealed are never changed."""
    masked = z == MASK
    reveal = masked & (torch.rand(z.shape, device=z.device) < (alpha(s) - alpha(t)) / (1 - alpha(t)))
    return torch.where(reveal, draw(logits, temperature), z)


class MDLMReasoner(Reasoner):
    """A bidirectional denoiser of ``n_layers`` blocks; ``config.cycles`` is the default number of unmasking
    steps at inference (``solve``'s ``steps`` overrides it)."""

    arch = "mdlm"
    generative = True

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.net = ReasoningModule(config)
        self.mask_embed = nn.Parameter(torch.randn(config.dim))  # unit RMS, like the scaled token embeddings

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        return {}

    def denoise(self, inputs: torch.Tensor, z: torch.Tensor) -> ReasonerOutput:
        """``x_θ(z, x)``: logits ``[B, L, V]`` for the clean output given the partly masked ``z`` (``MASK``
        where masked) and the input grid."""
        e_x, rope = self.embed_input(inputs)
        e_z = self.embed(z.clamp(min=0).long()) * math.sqrt(self.config.dim)
        e_z = torch.where((z == MASK)[..., None], self.mask_embed.to(e_z.dtype), e_z)
        return self.readout(self.net(e_z, e_x, rope))

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        """With ``target``: the NELBO at one random time per sample (``out.loss``, masks from torch's RNG).
        Without: the one-shot prediction from the all-masked grid."""
        inputs = batch["inputs"]
        if target is None:
            return {}, self.denoise(inputs, torch.full_like(inputs, MASK))
        target = label_tokens(target)
        t = sample_times(inputs.shape[0], inputs.device)
        masked = torch.rand(target.shape, device=target.device) < (1 - alpha(t))[:, None]
        out = self.denoise(inputs, torch.where(masked, MASK, target))
        out.loss = mdlm_loss(out.logits, target, masked, t)
        return {}, out

    @torch.no_grad()
    def sample(
        self, inputs: torch.Tensor, steps: int | None = None, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampler of :func:`~latentloop.infer.scaling.solve`: ``(tokens [S, N, L], values [S, N])`` for
        ``inputs`` ``[N, L]``, one row per unmasking step. After step ``k`` the prediction is the revealed
        tokens with the denoiser's argmax elsewhere; after the last, every token is revealed. The value is
        :func:`geometric_mean_prob` of the prediction (each revealed token at the probability it was drawn
        with)."""
        steps = self.config.cycles if steps is None else steps
        if steps < 1:
            raise UsageError(f"unmasking steps must be at least 1, got {steps}")
        z = torch.full_like(inputs, MASK)
        log_probs = torch.zeros(inputs.shape, device=inputs.device)
        preds, values = [], []
        for k in range(steps):
            t, s = 1 - k / steps, 1 - (k + 1) / steps
            logits = self.denoise(inputs, z).logits.float()
            was_masked = z == MASK
            z = unmask(z, logits, t, s, temperature)
            step_lp = F.log_softmax(logits, -1)
            revealed_now = was_masked & (z != MASK)
            log_probs = torch.where(
                revealed_now, step_lp.gather(-1, z.clamp(min=0)[..., None])[..., 0], log_probs
            )
            best_lp, best = step_lp.max(-1)
            still = z == MASK
            preds.append(torch.where(still, best, z))
            values.append(geometric_mean_prob(torch.where(still, best_lp, log_probs)))
        return torch.stack(preds), torch.stack(values)
