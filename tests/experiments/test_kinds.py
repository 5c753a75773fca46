"""Experiment kinds: a kind registered by name decides the runs, the rows, the results and the report, and the
runner and the report do what it says without knowing its name."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from latentloop.cli.run import summary_lines
from latentloop.errors import UsageError
from latentloop.experiments import KINDS, load_experiment, register_kind
from latentloop.experiments.kinds import get_kind
from latentloop.experiments.kinds.base import ExperimentKind
from latentloop.experiments.report import plot_results, report_markdown, summary_rows
from latentloop.experiments.runner import run_experiment
from latentloop.experiments.training import planned_steps
from tests.tiny import TINY_REASONER, tiny_run

SRC = Path(__file__).resolve().parents[2] / "src" / "latentloop"


class ToyKind(ExperimentKind):
    """Trains every model one step and measures nothing: what each hook got, written where it can be seen."""

    def trained_specs(self, experiment):
        return [
            dataclasses.replace(spec, overrides=[*spec.overrides, "train.steps=1"])
            for spec in experiment.models
        ]

    def evaluate(self, experiment, index, spec, folder, trained, progress, log):
        return {"train": trained, "index": index, "overrides": spec.overrides}

    def aggregate(self, experiment, rows):
        return {"toy_models": len(rows)}

    def summary_rows(self, results: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"model": name, "index": row["index"]} for name, row in results["models"].items()]

    def report_markdown(self, results, command):
        rows = self.summary_rows(results)
        return f"toy report of {results['toy_models']} models: " + ", ".join(r["model"] for r in rows) + "\n"

    def summary_lines(self, results):
        return [f"toy {row['model']} {row['index']}" for row in self.summary_rows(results)]

    def plot(self, results, path):
        path.write_text("toy curves")

    def draw_examples(self, results, out):
        (out / "toy.txt").write_text("toy examples")


@pytest.fixture
def toy_kind():
    register_kind("toy", f"{__name__}:ToyKind")
    yield
    KINDS.pop("toy")


def test_a_registered_kind_builds_the_runs_rows_results_and_report(tmp_path, toy_kind):
    (tmp_path / "gram.yaml").write_text(yaml.safe_dump(tiny_run(TINY_REASONER, arch="gram")))
    spec = {
        "kind": "toy",
        "description": "toy",
        "models": {"a": {"config": "gram.yaml"}, "b": {"config": "gram.yaml"}},
    }
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(spec))
    experiment = load_experiment(str(tmp_path / "toy.yaml"))
    assert isinstance(get_kind(experiment.kind), ToyKind)
    assert planned_steps(experiment) == {"a": 1, "b": 1}  # the kind's runs, not the file's 4 steps

    out = tmp_path / "out"
    results = run_experiment(experiment, out, progress=False, log=lambda _: None)
    assert results["kind"] == "toy" and results["toy_models"] == 2
    for index, name in enumerate(("a", "b")):
        row = results["models"][name]
        assert row["index"] == index and row["overrides"] == ["train.steps=1"]
        assert row["train"]["step"] == 1 and (out / name / "train.json").is_file()
    assert json.loads((out / "results.json").read_text()) == results
    assert (out / "report.md").read_text() == "toy report of 2 models: a, b\n" == report_markdown(results)
    assert (out / "curves.png").read_text() == "toy curves" and (out / "toy.txt").is_file()
    assert summary_rows(results) == [{"model": "a", "index": 0}, {"model": "b", "index": 1}]
    assert summary_lines(results) == ["toy a 0", "toy b 1"]  # the command line's table too
    plot_results(results, tmp_path / "again.png")
    assert (tmp_path / "again.png").read_text() == "toy curves"


def test_an_unregistered_kind_is_refused_when_the_file_is_read(tmp_path):
    (tmp_path / "gram.yaml").write_text(yaml.safe_dump(tiny_run(TINY_REASONER, arch="gram")))
    spec = {"kind": "toy", "models": {"a": {"config": "gram.yaml"}}}
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(UsageError, match="kind must be one of reasoners, lm, generation, time-to-accuracy"):
        load_experiment(str(tmp_path / "toy.yaml"))
    with pytest.raises(UsageError, match="unknown experiment kind 'toy'"):
        get_kind("toy")
    with pytest.raises(ValueError, match="module:Class"):
        register_kind("toy", "tests.experiments.test_kinds.ToyKind")


def test_every_shipped_kind_is_an_experiment_kind():
    assert all(isinstance(get_kind(name), ExperimentKind) for name in KINDS)


def test_no_module_compares_a_kind_by_its_name():
    """What differs between kinds lives in their classes: nothing else asks ``kind == "lm"``."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Constant) and side.value in KINDS
                for side in [node.left, *node.comparators]
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
