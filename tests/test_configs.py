"""The shipped configs: every one builds its model for its task, and the models an experiment compares have
the same parameter count within 20%, as the comparison promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from latentloop.config import load_yaml
from latentloop.experiments import available_experiments, load_experiment
from latentloop.models.reasoners import REASONERS, build_reasoner, num_parameters
from latentloop.tasks.base import get_task
from latentloop.train.deep_supervision import build_reasoner_config, fit_to_task
from latentloop.train.trainer import build_run_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def parameters(path: Path, overrides: list[str] = ()) -> int:
    """Parameters of the config's model, puzzle embeddings aside (they depend on the dataset, not the model)."""
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


@pytest.mark.parametrize("name", available_experiments())
def test_an_experiments_models_have_equal_parameter_counts_within_20_percent(name):
    experiment = load_experiment(name)
    if experiment.kind == "lm":
        pytest.skip("one model against test-time depth")
    counts = {spec.name: parameters(spec.config, spec.overrides) for spec in experiment.models}
    assert max(counts.values()) <= 1.2 * min(counts.values()), counts
