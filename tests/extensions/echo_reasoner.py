"""A reasoner added as one file, the way a user adds a model: a single shared block applied once per
supervision step. Defining the class registers it as ``--model echo``."""

from __future__ import annotations

import torch

from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule


class EchoReasoner(Reasoner):
    """``h <- f(h, e_x)`` once per supervision step."""

    arch = "echo"

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.f = ReasoningModule(config)
        self.init_state("h_init")

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        return {"h": self.broadcast_state("h_init", batch["inputs"])}

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        e_x, rope = self.embed_input(batch["inputs"], batch.get("puzzle_ids"))
        h = self.f(carry["h"], e_x, rope)
        return {"h": h.detach()}, self.readout(h)
