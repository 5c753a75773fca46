"""HRM (hierarchical reasoning model): a fast low-level module L and a slow high-level module H.

Per supervision step, ``cycles`` (H_cycles) high-level updates, each after ``inner`` (L_cycles) low-level ones:
``z_L = L(z_L, z_H + x)``, then ``z_H = H(z_H, z_L)``. One-step gradient: only the last L update and the last
H update are differentiated. The decoder and the Q-head read ``z_H``.
"""

from __future__ import annotations

import torch

from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule


class HRMReasoner(Reasoner):
    """Two modules: L of ``n_layers`` blocks and H of ``h_layers`` (default ``n_layers``); the paper's post-norm
    layout by default."""

    arch = "hrm"

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.L = ReasoningModule(config)
        self.H = ReasoningModule(config, config.h_layers or None)
        self.init_state("z_H_init")
        self.init_state("z_L_init")

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        x = batch["inputs"]
        return {"z_H": self.broadcast_state("z_H_init", x), "z_L": self.broadcast_state("z_L_init", x)}

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        x, rope = self.embed_input(batch["inputs"], batch.get("puzzle_ids"))
        z_H, z_L = carry["z_H"], carry["z_L"]
        H_cycles, L_cycles = self.config.cycles, self.config.inner
        with torch.no_grad():
            for i in range(H_cycles * L_cycles - 1):
                z_L = self.L(z_L, z_H + x, rope)
                if (i + 1) % L_cycles == 0:
                    z_H = self.H(z_H, z_L, rope)
        # The 1-step gradient approximation: differentiate only the final L and H updates.
        z_L = self.L(z_L, z_H + x, rope)
        z_H = self.H(z_H, z_L, rope)
        return {"z_H": z_H.detach(), "z_L": z_L.detach()}, self.readout(z_H)
