"""kind: time-to-accuracy: every checkpoint evaluated against its training cost, targets, the ablation's gains."""

from __future__ import annotations

import json

import pytest
import yaml

from latentloop.errors import UsageError
from latentloop.experiments import load_experiment
from latentloop.experiments.kinds import time_to_accuracy as kind_module
from latentloop.experiments.kinds.time_to_accuracy import ablation_gains, curve_summary, first_reached
from latentloop.experiments.report import format_flops, plot_results, report_markdown
from latentloop.experiments.runner import run_experiment
from latentloop.experiments.spec import ModelSpec
from tests.tiny import TINY_REASONER, tiny_run

QUIET = {"progress": False, "log": lambda _: None}


def write_experiment(folder, **changes):
    """A two-row ablation of tiny GRAM runs on N-Queens 5x5 (4 batches, a checkpoint every 2)."""
    run = tiny_run(TINY_REASONER, arch="gram", train={"eval_size": 0})
    (folder / "gram.yaml").write_text(yaml.safe_dump(run))
    spec = {
        "kind": "time-to-accuracy",
        "description": "tiny time to accuracy",
        "budget_minutes": 5,
        "models": {
            "baseline": {"config": "gram.yaml"},
            "lower-lr": {"config": "gram.yaml", "overrides": ["train.lr=1e-3"]},
        },
        "eval": {"samples": 2, "steps": 2, "limit": 4, "every": 2},
        "targets": {"accuracy": 95, "coverage": 80},
        **changes,
    }
    path = folder / "tta.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"targets": {"loss": 5}}, r"targets\.loss is not a metric \(known: accuracy, coverage\)"),
        ({"targets": {"accuracy": 150}}, r"targets\.accuracy must be a percent"),
        ({"targets": {"coverage": 0}}, r"targets\.coverage must be a percent"),
        ({"targets": {"accuracy": "high"}}, r"targets\.accuracy must be a percent"),
        ({"targets": [95]}, "targets must map metrics"),
        ({"eval": {"every": 0}}, r"eval\.every must be an integer of at least 1"),
        ({"eval": {"every": 2.5}}, r"eval\.every must be an integer of at least 1"),
        ({"eval": {"every": "often"}}, r"eval\.every must be an integer of at least 1"),
        ({"eval": {"split": "train"}}, r"eval\.split must be test or validation"),
    ],
)
def test_bad_targets_and_every_are_one_line_usage_errors(tmp_path, changes, message):
    with pytest.raises(UsageError, match=message) as caught:
        load_experiment(str(write_experiment(tmp_path, **changes)))
    assert "\n" not in str(caught.value)


def test_spec_defaults_and_overrides(tmp_path):
    experiment = load_experiment(str(write_experiment(tmp_path, eval={"samples": 2}, targets=None)))
    assert experiment.kind == "time-to-accuracy"
    assert experiment.eval.every == 250 and experiment.targets == {}
    experiment = load_experiment(str(write_experiment(tmp_path)), ["eval.every=3"])
    assert experiment.eval.every == 3 and experiment.targets == {"accuracy": 95.0, "coverage": 80.0}
    with pytest.raises(UsageError, match=r"eval\.every"):
        load_experiment(str(write_experiment(tmp_path)), ["eval.every=0"])


def curve(accuracies, minutes, coverages=None):
    coverages = coverages or [None] * len(accuracies)
    return [
        {
            "step": 10 * (i + 1),
            "train_minutes": m,
            "examples_seen": 100 * (i + 1),
            "flops": None,
            "accuracy": a,
            "accuracy_1_sample": a,
            "accuracy_value": a,
            "coverage": c,
        }
        for i, (a, m, c) in enumerate(zip(accuracies, minutes, coverages, strict=True))
    ]


def test_first_reached_is_the_first_point_at_or_above_the_target():
    points = curve([0.0, 0.5, 0.96, 0.97], [1, 2, 3, 4])
    assert first_reached(points, "accuracy", 95)["train_minutes"] == 3
    assert first_reached(points, "accuracy", 96)["train_minutes"] == 3  # reaching it exactly counts
    assert first_reached(points, "accuracy", 50)["step"] == 20
    assert first_reached(points, "accuracy", 98) is None
    assert first_reached(points, "coverage", 10) is None  # a task without coverage never reaches it
    assert first_reached(curve([0.57], [1]), "accuracy", 57) is not None  # 0.57 * 100 < 57 in floats
    assert first_reached([], "accuracy", 1) is None


def test_curve_summary_and_ablation_gains():
    targets = {"accuracy": 95.0, "coverage": 80.0}
    slow = curve([0.0, 0.5, 0.96, 0.97], [1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    fast = curve([0.96, 0.98], [1.5, 3], [0.5, 0.9])
    rows = {
        "baseline": {"adds": [], "summary": curve_summary(slow, targets)},
        "faster": {"adds": ["train.lr=1e-3"], "summary": curve_summary(fast, targets)},
    }
    summary = rows["baseline"]["summary"]
    assert summary["points"] == 4 and summary["final"]["accuracy"] == 0.97
    assert summary["targets"]["accuracy"]["reached"] == {
        "step": 30,
        "train_minutes": 3,
        "examples_seen": 300,
        "flops": None,
    }
    assert summary["targets"]["coverage"] == {"target": 80.0, "reached": None}
    (gain,) = ablation_gains(rows, targets)
    assert gain["model"] == "faster" and gain["over"] == "baseline" and gain["adds"] == ["train.lr=1e-3"]
    assert gain["time_to_target_ratio"] == {"accuracy": 2.0, "coverage": None}  # 3 min / 1.5 min
    assert gain["accuracy_difference"] == pytest.approx(0.01)
    assert gain["coverage_difference"] == pytest.approx(0.5)
    assert format_flops(1.234e14) == "1.23e14" and format_flops(None) == "-"


def count_evaluations(monkeypatch):
    calls = []
    real = kind_module.evaluate_reasoner

    def counted(checkpoint, **kwargs):
        calls.append(checkpoint)
        assert kwargs["write"] is False and kwargs["progress"] is False
        return real(checkpoint, **kwargs)

    monkeypatch.setattr(kind_module, "evaluate_reasoner", counted)
    return calls


def test_every_checkpoint_is_evaluated_once_and_reported(tmp_path, monkeypatch):
    calls = count_evaluations(monkeypatch)
    path = write_experiment(tmp_path)
    out = tmp_path / "out"
    results = run_experiment(load_experiment(str(path)), out, **QUIET)
    assert len(calls) == 4  # two models, checkpoints at batches 2 and 4
    for name, row in results["models"].items():
        checkpoints = sorted(p.name for p in (out / name / "checkpoints").iterdir())
        assert checkpoints == ["step_00000002", "step_00000004"]  # every one kept
        cached = json.loads((out / name / "curve.json").read_text())
        assert sorted(cached["points"]) == ["2", "4"]
        assert [p["step"] for p in row["curve"]] == [2, 4]
        first, last = row["curve"]
        assert first["checkpoint"] == "checkpoints/step_00000002"  # relative, not a machine path
        assert 0 < first["train_minutes"] <= last["train_minutes"]
        assert (first["examples_seen"], last["examples_seen"]) == (16, 32)  # batches of 8
        assert all(0 <= p["accuracy"] <= 1 and 0 <= p["coverage"] <= 1 for p in row["curve"])
        assert row["summary"]["final"]["step"] == 4 and row["config"] == "gram.yaml"
        train = json.loads((out / name / "train.json").read_text())
        extra = ["train.checkpoint_every=2", "train.keep_checkpoints=0", "train.eval_every=0"]
        assert train["overrides"][-3:] == extra
    assert results["models"]["lower-lr"]["adds"] == ["train.lr=1e-3"]
    assert results["targets"] == {"accuracy": 95.0, "coverage": 80.0}
    assert [g["model"] for g in results["ablation"]] == ["lower-lr"]
    saved = json.loads((out / "results.json").read_text())
    assert saved["models"]["baseline"]["curve"] == results["models"]["baseline"]["curve"]
    report = (out / "report.md").read_text()
    assert report == report_markdown(saved)  # the report is made from results.json alone
    assert "| baseline |" in report and "| lower-lr | `train.lr=1e-3` |" in report
    assert "accuracy ≥ 95% first at (min / examples / FLOPs)" in report
    assert "- lower-lr (+ train.lr=1e-3) over baseline:" in report
    assert (out / "curves.png").stat().st_size > 0

    # A rerun trains nothing (train.json's overrides match) and evaluates no checkpoint again.
    calls.clear()
    lines: list[str] = []
    again = run_experiment(load_experiment(str(path)), out, progress=False, log=lines.append)
    assert calls == [] and again["models"] == results["models"]
    assert sum("trained already" in line for line in lines) == 2
    assert sum("evaluated already" in line for line in lines) == 2

    # Resumable: a point missing from curve.json (as if interrupted) is the only one evaluated.
    cache = out / "baseline" / "curve.json"
    cached = json.loads(cache.read_text())
    del cached["points"]["4"]
    cache.write_text(json.dumps(cached))
    run_experiment(load_experiment(str(path)), out, **QUIET)
    assert [c.name for c in calls] == ["step_00000004"]

    # Another checkpoint spacing would mix two runs: refused like any other change of overrides.
    with pytest.raises(UsageError, match="trained with overrides"):
        run_experiment(load_experiment(str(path), ["eval.every=1"]), out, **QUIET)


def test_a_curve_on_the_validation_split_never_reads_the_test_puzzles(tmp_path, monkeypatch):
    calls = count_evaluations(monkeypatch)
    path = write_experiment(tmp_path)
    experiment = load_experiment(
        str(path), ["train.validation=2", "eval.split=validation", "eval.limit=null"]
    )
    results = run_experiment(experiment, tmp_path / "out", **QUIET)
    assert len(calls) == 4
    for row in results["models"].values():
        assert [p["puzzles"] for p in row["curve"]] == [2, 2]  # the held-out training puzzles, not test's
    cached = json.loads((tmp_path / "out" / "baseline" / "curve.json").read_text())
    assert cached["settings"]["split"] == "validation"
    assert "2 validation puzzles" in (tmp_path / "out" / "report.md").read_text()


def test_report_of_hand_built_results_says_not_reached_and_the_differences():
    targets = {"accuracy": 95.0}
    rows = {}
    for name, accuracies, flops in (("a", [0.2, 0.4], 1.234e14), ("b", [0.5, 0.6], None)):
        points = curve(accuracies, [1, 2])
        for p in points:
            p["flops"], p["puzzles"] = flops, 10
        rows[name] = {
            "train": {"parameters": 1000},
            "config": "gram.yaml",
            "adds": [] if name == "a" else ["train.lr=1e-3"],
            "curve": points,
            "summary": curve_summary(points, targets),
        }
    results = {
        "experiment": "hand",
        "kind": "time-to-accuracy",
        "description": "hand-built",
        "date": "2024-01-01",
        "machine": {"cpus": 2, "torch": "2", "device": "cpu"},
        "budget_minutes_per_model": 2,
        "eval": {"samples": 2, "steps": 2, "every": 10},
        "targets": targets,
        "models": rows,
        "ablation": ablation_gains(rows, targets),
        "paper_note": "",
    }
    report = report_markdown(results)
    assert "| a | - | 2 | 40.0 | 40.0 | - | 2 / 200 / 1.23e14 | not reached |" in report
    assert "| b | `train.lr=1e-3` | 2 | 60.0 | 60.0 | - | 2 / 200 / - | not reached |" in report
    assert "accuracy ≥ 95%: not reached by both rows; final accuracy +20.0 points, coverage -" in report


def test_a_row_that_drops_an_override_adds_the_configs_own_value(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  lr: 0.0015\n  curriculum: [{until: 0.4, n_sup: 4}]\n  augment: true\n")
    before = ModelSpec(
        "a", config, ["train.lr=1e-3", "train.curriculum=[]", "train.augment=false", "train.ema=0.9"]
    )
    spec = ModelSpec("b", config, ["train.augment=false", "train.seed=1"])
    assert kind_module._adds(spec, before, None) == [
        "train.seed=1",
        "train.lr=0.0015 (config)",
        'train.curriculum=[{"until": 0.4, "n_sup": 4}] (config)',
        "train.ema default",
    ]


def test_the_coverage_row_is_drawn_only_for_tasks_with_coverage(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    shapes = []
    real = plt.subplots

    def recorded(*args, **kwargs):
        shapes.append(args[:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(plt, "subplots", recorded)
    point = {"step": 1, "train_minutes": 1.0, "examples_seen": 8, "flops": 1e9, "accuracy": 0.5}
    for coverage in (None, 0.4):
        curve = [{**point, "coverage": coverage}]
        results = {
            "experiment": "x",
            "kind": "time-to-accuracy",
            "targets": {},
            "models": {"a": {"curve": curve}},
        }
        plot_results(results, tmp_path / "curves.png")
    assert shapes == [(1, 3), (2, 3)]
