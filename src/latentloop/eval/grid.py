"""The test-time compute grid of an evaluation: which (steps, samples) cells are measured.

Kept apart from :mod:`latentloop.eval.reasoners` (and free of torch) so that reading an experiment file can
check its ``eval:`` options without loading the models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latentloop.errors import UsageError

# The options of an experiment's ``eval:`` mapping that make up its grid (ComputeGrid's fields)
GRID_FIELDS = ("steps_grid", "samples_grid", "width_depths", "state_noise", "timing_puzzles")


@dataclass
class ComputeGrid:
    """The (steps, samples) cells whose accuracy, inference FLOPs and time per puzzle are measured.

    ``steps_grid``: the depth curve, one trajectory run to each of these depths (a deterministic model without
    noise). ``width_depths`` x ``samples_grid``: the width curves, ``K`` trajectories stopped at each depth,
    selected by vote, value head and halting head (``q``); measured only for a model whose samples differ,
    GRAM by its own noise, any other reasoner when ``state_noise`` > 0 (PTRM's noisy TRM: Gaussian noise of
    that standard deviation added to its latent state before every supervision step). ``timing_puzzles``:
    how many puzzles are solved one at a time to time each cell.
    """

    steps_grid: list[int] = field(default_factory=list)
    samples_grid: list[int] = field(default_factory=list)
    width_depths: list[int] = field(default_factory=list)
    state_noise: float = 0.0
    timing_puzzles: int = 8

    def __post_init__(self) -> None:
        for name in ("steps_grid", "samples_grid", "width_depths"):
            values = getattr(self, name)
            if not isinstance(values, list) or not all(isinstance(v, int) and v >= 1 for v in values):
                raise UsageError(f"{name} must be a list of whole numbers of at least 1, got {values!r}")
            setattr(self, name, sorted(set(values)))
        if bool(self.samples_grid) != bool(self.width_depths):
            raise UsageError("samples_grid and width_depths go together: the width curves need both")
        if isinstance(self.state_noise, bool) or not isinstance(self.state_noise, int | float):
            raise UsageError(f"state_noise must be a number, got {self.state_noise!r}")
        if not self.state_noise >= 0:
            raise UsageError(f"state_noise must be at least 0, got {self.state_noise}")
        self.state_noise = float(self.state_noise)
        if not isinstance(self.timing_puzzles, int) or self.timing_puzzles < 0:
            raise UsageError(
                f"timing_puzzles must be a whole number of at least 0, got {self.timing_puzzles!r}"
            )

    @classmethod
    def of(cls, settings: Any) -> ComputeGrid:
        """The grid of an object with these fields' names (an experiment's ``EvalSpec``)."""
        return cls(**{name: getattr(settings, name) for name in GRID_FIELDS})

    @property
    def active(self) -> bool:
        """Whether any cell is asked for."""
        return bool(self.steps_grid or self.width_depths)
