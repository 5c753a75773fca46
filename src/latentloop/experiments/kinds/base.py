"""The interface of an experiment kind: the runs it trains, what it measures on each, and how it reports."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from latentloop.experiments.spec import Experiment, ModelSpec
from latentloop.experiments.training import REASONER_RUNS, ModelRuns


class ExperimentKind(ABC):
    """One ``kind:`` of experiment (registered in :data:`latentloop.experiments.kinds.KINDS`).

    The runner trains each model of :meth:`trained_specs` as :attr:`runs` says, asks :meth:`evaluate` for its
    row of the results, and adds :meth:`aggregate`'s keys to the results; the report draws the rows, the
    Markdown and the pictures from the results alone (:meth:`summary_rows`, :meth:`report_markdown`,
    :meth:`summary_lines`, :meth:`plot`, :meth:`draw_examples`), so that a report can be rewritten later
    without running anything again.
    """

    # How the kind's models are configured and trained.
    runs: ClassVar[ModelRuns] = REASONER_RUNS

    def trained_specs(self, experiment: Experiment) -> list[ModelSpec]:
        """The models as they are trained (by default as the experiment file gives them)."""
        return list(experiment.models)

    @abstractmethod
    def evaluate(
        self,
        experiment: Experiment,
        index: int,
        spec: ModelSpec,
        folder: Path,
        trained: dict[str, Any],
        progress: bool,
        log: Callable[[str], None],
    ) -> dict[str, Any]:
        """Model ``index`` of ``experiment`` (``spec``, as trained into ``folder``; ``trained``: its
        ``train.json`` summary) evaluated: its row of the results, ``trained`` included. What it measures is
        stored in ``folder`` so that a rerun with the same settings reads it back."""

    def aggregate(self, experiment: Experiment, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """What the results hold beside the rows, made from all of them (by default nothing)."""
        return {}

    @abstractmethod
    def summary_rows(self, results: dict[str, Any]) -> list[dict[str, Any]]:
        """The flat rows of the report's main table, made from ``results``."""

    @abstractmethod
    def report_markdown(self, results: dict[str, Any], command: str | None) -> str:
        """The Markdown report of ``results`` (``command``: the one that reproduces it, shown when given)."""

    @abstractmethod
    def summary_lines(self, results: dict[str, Any]) -> list[str]:
        """The summary table printed after a run, one line per row."""

    @abstractmethod
    def plot(self, results: dict[str, Any], path: Path) -> None:
        """The curves of ``results``, drawn into ``path`` (``curves.png``)."""

    def draw_examples(self, results: dict[str, Any], out: Path) -> None:
        """Pictures of the models' answers into the output folder ``out`` (by default none)."""
        return None
