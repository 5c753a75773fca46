"""The shipped configs: each builds its model for its task, the models of one task have the same size within
20%, and so do the models each shipped experiment compares (with its overrides)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from latentloop.config import load_yaml
from latentloop.experiments import available_experiments, load_experiment
from latentloop.models.reasoners import REASONERS, build_reasoner, num_parameters
from latentloop.paths import CONFIGS_DIR
from latentloop.tasks.base import get_task
from latentloop.train.run_config import build_reasoner_config, build_run_config, fit_to_task

CONFIGS = CONFIGS_DIR  # shipped in the package; the repository's configs/ links to it
TABLES = ("nqueens8", "graph-coloring8", "sudoku", "arc-agi-1")  # one results table per task
MULTI_SOLUTION = ("nqueens8", "graph-coloring8")  # their tables have the generative baselines too


def parameters(path: Path, overrides: Sequence[str] = ()) -> int:
    """Parameters of the config's model; puzzle embeddings (ARC) aside, as they depend on the dataset."""
    config = build_reasoner_config(load_yaml(path), list(overrides))
    task = get_task(config.task.name, **config.task.options)
    return num_parameters(build_reasoner(config.arch, fit_to_task(config.model, task)))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_builds_its_model(path):
    data = load_yaml(path)
    if data.get("arch", "recurrent-depth") in REASONERS:
        assert parameters(path) > 0
    else:
        assert build_run_config(data).model.n_embd > 0


@pytest.mark.parametrize("table", TABLES)
def test_models_of_one_table_have_the_same_parameter_count_within_20_percent(table):
    # One config per architecture makes the table; variants (nqueens8-gram-long, -fast) train other recipes.
    paths = [
        CONFIGS / f"{table}-{arch}.yaml" for arch in REASONERS if (CONFIGS / f"{table}-{arch}.yaml").is_file()
    ]
    counts = {path.stem.removeprefix(f"{table}-"): parameters(path) for path in paths}
    assert {"direct", "looped", "hrm", "trm", "gram"} <= set(counts), counts
    if table in MULTI_SOLUTION:
        assert {"ar", "mdlm"} <= set(counts), counts
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts


@pytest.mark.parametrize("pair", ["digits", "sudoku6-unconditional"])
def test_models_compared_in_pairs_have_the_same_parameter_count_within_20_percent(pair):
    counts = {path.stem: parameters(path) for path in sorted(CONFIGS.glob(f"{pair}-*.yaml"))}
    assert f"{pair}-gram" in counts and len(counts) == 2, counts
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts


@pytest.mark.parametrize("name", available_experiments())
def test_the_models_an_experiment_compares_have_equal_sizes_within_20_percent(name):
    experiment = load_experiment(name)
    if experiment.kind == "lm":
        pytest.skip("one model against test-time depth")
    if experiment.kind == "time-to-accuracy":
        pytest.skip("an ablation's rows may change the model's size: a smaller model is one of its options")
    counts = {spec.name: parameters(spec.config, spec.overrides) for spec in experiment.models}
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts
