"""Depth samplers: how many core iterations a training step runs, and how many of them get gradients.

Every draw is a pure function of ``(seed, step)`` (a NumPy generator seeded from both), so all data-parallel
ranks draw the same depth at the same step without communicating ("lockstep"), and a resumed run draws exactly
what an uninterrupted one would have.

Schemes, for mean recurrence ``r̄`` and backprop depth ``k``:

- ``poisson-lognormal`` (Geiping et al. 2025): ``rate ~ LogNormal(ln r̄ - σ²/2, σ)`` with σ = 0.5 (so the rate
  has mean r̄), ``p = Poisson(rate) + 1``. Heavy-tailed: with r̄=32 the mean is ~33, the median ~29.
- ``fixed``: always ``p = r̄``.
- ``uniform``: ``p`` uniform on ``1 .. 2r̄-1`` (mean r̄).

A total depth ``p`` is split into ``max(p - k, 0)`` iterations without gradient followed by ``min(k, p)`` with
gradient (truncated backpropagation through the last k iterations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthConfig

SCHEMES = ("poisson-lognormal", "fixed", "uniform")

# Stream tag mixed into the seed so depth draws never share a stream with data or init draws of the same seed.
_DEPTH_STREAM = 0x5EED_DE9


@dataclass(frozen=True)
class DepthSampler:
    """Draws ``(no_grad_steps, grad_steps)`` for a training step; see the module docstring for the schemes."""

    scheme: str = "poisson-lognormal"
    mean_recurrence: int = 8
    backprop_depth: int = 4
    seed: int = 0
    sigma: float = 0.5

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise UsageError(f"unknown depth sampling scheme {self.scheme!r} (known: {', '.join(SCHEMES)})")
        if self.mean_recurrence < 1:
            raise UsageError(f"mean_recurrence must be at least 1, got {self.mean_recurrence}")
        if self.backprop_depth < 0:
            raise UsageError(f"mean_backprop_depth must not be negative, got {self.backprop_depth}")
        if not self.sigma > 0:
            raise UsageError(f"sigma must be positive, got {self.sigma}")

    def total_depth(self, step: int) -> int:
        """The total number of core iterations ``p >= 1`` drawn for ``step``."""
        if self.scheme == "fixed":
            return self.mean_recurrence
        rng = np.random.default_rng([_DEPTH_STREAM, int(self.seed) & 0xFFFFFFFF, int(step)])
        if self.scheme == "uniform":
            return int(rng.integers(1, 2 * self.mean_recurrence))  # high is exclusive: 1 .. 2r̄-1
        mu = math.log(self.mean_recurrence) - self.sigma**2 / 2
        rate = rng.lognormal(mean=mu, sigma=self.sigma)
        return int(rng.poisson(rate)) + 1

    def split(self, total: int) -> tuple[int, int]:
        """``(max(total - k, 0), min(k, total))``: no-grad iterations first, the last ``k`` with gradient."""
        k = self.backprop_depth
        return max(total - k, 0), min(k, total)

    def __call__(self, step: int) -> tuple[int, int]:
        """``(no_grad_steps, grad_steps)`` for ``step``; pass this pair as ``num_steps`` to the model."""
        return self.split(self.total_depth(step))


def sampler_for(config: RecurrentDepthConfig, seed: int) -> DepthSampler:
    """The sampler that a model config asks for (its scheme, mean recurrence and backprop depth)."""
    return DepthSampler(
        scheme=config.sampling_scheme,
        mean_recurrence=config.mean_recurrence,
        backprop_depth=config.mean_backprop_depth,
        seed=seed,
    )
