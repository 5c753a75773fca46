"""Looped transformer: one block stack applied repeatedly, the input injected at every application."""

from __future__ import annotations

import torch

from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule


class LoopedReasoner(Reasoner):
    """``h <- f(h, e_x)`` ``cycles`` times per supervision step; the first ``cycles - 1`` without gradient."""

    arch = "looped"

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
        h = carry["h"]
        with torch.no_grad():
            for _ in range(self.config.cycles - 1):
                h = self.f(h, e_x, rope)
        h = self.f(h, e_x, rope)
        return {"h": h.detach()}, self.readout(h)
