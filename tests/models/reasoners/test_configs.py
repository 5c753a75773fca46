"""The shipped reasoner configs: each loads, and the models of one task have the same size within 20%."""

from __future__ import annotations

from pathlib import Path

import pytest

from latentloop.config import load_yaml
from latentloop.models.reasoners import build_reasoner, num_parameters
from latentloop.tasks.base import get_task
from latentloop.train.deep_supervision import build_reasoner_config, fit_to_task

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TABLES = ("nqueens8", "graph-coloring8", "sudoku")  # one results table per task: its rows share a budget


def parameters(path: Path) -> int:
    config = build_reasoner_config(load_yaml(path))
    task = get_task(config.task.name, **config.task.options)
    return num_parameters(build_reasoner(config.arch, fit_to_task(config.model, task)))


@pytest.mark.parametrize("table", TABLES)
def test_models_of_one_table_have_the_same_parameter_count_within_20_percent(table):
    paths = sorted(CONFIGS.glob(f"{table}-*.yaml"))
    counts = {path.stem.removeprefix(f"{table}-"): parameters(path) for path in paths}
    assert len(counts) >= 5, counts
    if table != "sudoku":  # the multi-solution tables have generative baselines too
        assert {"ar", "mdlm"} <= set(counts), counts
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts


@pytest.mark.parametrize("pair", ["digits", "sudoku6-unconditional", "arc-agi-1"])
def test_models_compared_in_pairs_have_the_same_parameter_count_within_20_percent(pair):
    counts = {path.stem: parameters(path) for path in sorted(CONFIGS.glob(f"{pair}-*.yaml"))}
    assert f"{pair}-gram" in counts and len(counts) == 2, counts
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts
