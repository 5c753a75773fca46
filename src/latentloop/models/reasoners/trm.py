"""TRM (tiny recursive model): one small network that refines a latent ``z`` and an answer ``y``.

``latent_recursion``: ``n`` times ``z = net(x + y + z)``, then ``y = net(y + z)``.
``deep_recursion``: ``T - 1`` latent recursions without gradient, then one with gradient.
Here ``n`` is ``config.inner`` and ``T`` is ``config.cycles``; ``config.mixer = "mlp"`` gives the variant with
an MLP over the sequence in place of attention. The decoder and the Q-head read ``y``.
"""

from __future__ import annotations

import torch

from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule


class TRMReasoner(Reasoner):
    """One network of ``n_layers`` blocks used for both the latent and the answer update."""

    arch = "trm"

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.net = ReasoningModule(config)
        self.init_state("y_init")
        self.init_state("z_init")

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        x = batch["inputs"]
        return {"y": self.broadcast_state("y_init", x), "z": self.broadcast_state("z_init", x)}

    def latent_recursion(
        self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, rope: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(self.config.inner):
            z = self.net(z, x + y, rope)  # z = net(x + y + z)
        y = self.net(y, z, rope)  # y = net(y + z)
        return y, z

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        x, rope = self.embed_input(batch["inputs"], batch.get("puzzle_ids"))
        y, z = carry["y"], carry["z"]
        with torch.no_grad():
            for _ in range(self.config.cycles - 1):
                y, z = self.latent_recursion(x, y, z, rope)
        y, z = self.latent_recursion(x, y, z, rope)
        return {"y": y.detach(), "z": z.detach()}, self.readout(y)
