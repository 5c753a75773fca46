"""Direct transformer: the input mapped to the output in one pass, no latent carried between steps."""

from __future__ import annotations

import torch

from latentloop.models.reasoners.base import Carry, Reasoner, ReasonerConfig, ReasonerOutput, ReasoningModule


class DirectReasoner(Reasoner):
    """``logits = head(f(e_x))`` with ``f`` a stack of ``n_layers`` blocks. A supervision step is one pass."""

    arch = "direct"

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__(config)
        self.net = ReasoningModule(config)

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        return {}

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        e_x, rope = self.embed_input(batch["inputs"], batch.get("puzzle_ids"))
        return {}, self.readout(self.net(e_x, None, rope))
