"""The test-time compute grid of an evaluation: its cells' accuracy, FLOPs and time, its table, plot and
options."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import yaml

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.eval.grid import ComputeGrid
from latentloop.eval.reasoners import compute_table, evaluate_grid, evaluate_model
from latentloop.experiments import load_experiment
from latentloop.experiments.runner import run_experiment
from latentloop.infer.scaling import inference_flops, step_cost
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.tasks.base import get_task
from tests.tiny import TINY_REASONER, tiny_run


@pytest.fixture(scope="module")
def task():
    return get_task("nqueens", n=5)


@pytest.fixture(scope="module")
def inputs(task):
    pairs = itertools.islice(task.examples("test", seed=0), 6)
    return np.stack([np.asarray(task.encode(puzzle), dtype=np.uint8) for puzzle, _ in pairs])


def _trm(task):
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=task.vocab_size,
        seq_len=task.seq_len,
        dim=16,
        n_heads=2,
        n_layers=1,
        hidden=32,
        cycles=2,
        inner=1,
    )
    return build_reasoner("trm", config).eval()


def test_every_cell_has_its_accuracy_flops_and_time(task, inputs):
    model = _trm(task)
    grid = ComputeGrid(
        steps_grid=[3, 1], samples_grid=[1, 2], width_depths=[2], state_noise=0.5, timing_puzzles=2
    )
    compute = evaluate_grid(model, task, inputs, grid, batch_size=4, progress=False)
    cost = step_cost(model)
    assert (compute["step_flops"], compute["value_head_flops"]) == (cost.step, cost.value_head)
    cells = [(c["curve"], c["steps"], c["samples"], c["select"]) for c in compute["cells"]]
    assert cells == [("depth", 1, 1, "first"), ("depth", 3, 1, "first")] + [
        ("width", 2, k, mode) for k in (1, 2) for mode in ("vote", "value", "q")
    ]
    for cell in compute["cells"]:
        assert cell["flops"] == inference_flops(cost, cell["steps"], cell["samples"], cell["select"])
        assert isinstance(cell["ms_per_puzzle"], float)  # wall-clock: reported, its value not checked
    # The depth curve is the deterministic model's own, without the noise of the widths.
    plain = evaluate_model(model, task, inputs, samples=1, steps=3, select="first", progress=False)
    by_step = {p["steps"]: p["accuracy"] for p in plain["curve_steps"]}
    assert [c["accuracy"] for c in compute["cells"][:2]] == [by_step[1], by_step[3]]


def test_a_deterministic_model_without_noise_has_no_width_curves(task, inputs):
    grid = ComputeGrid(steps_grid=[1], samples_grid=[1, 2], width_depths=[2], timing_puzzles=0)
    compute = evaluate_grid(_trm(task), task, inputs, grid, progress=False)
    assert [c["curve"] for c in compute["cells"]] == ["depth"]
    assert compute["cells"][0]["ms_per_puzzle"] is None  # no puzzle was timed


def test_grid_options_are_checked():
    assert not ComputeGrid().active
    assert ComputeGrid(steps_grid=[4, 1, 4]).steps_grid == [1, 4]
    for bad in (
        {"samples_grid": [1, 2]},  # without width_depths
        {"steps_grid": [0, 1]},
        {"steps_grid": "1,2"},
        {"state_noise": -0.1},
        {"timing_puzzles": -1},
    ):
        with pytest.raises(UsageError):
            ComputeGrid(**bad)


def test_the_compute_table_lists_every_cell():
    def cell(curve, steps, samples, select, accuracy, ms):
        flops = steps * samples * 1.5e9
        return {"curve": curve, "steps": steps, "samples": samples, "select": select, "accuracy": accuracy,
                "flops": flops, "ms_per_puzzle": ms}  # fmt: skip

    report = {
        "compute": {
            "settings": {"timing_puzzles": 4},
            "step_flops": 1.5e9,
            "value_head_flops": 256,
            "state_noise": 0.3,
            "cells": [
                cell("depth", 1, 1, "first", 0.125, 6.04),
                cell("depth", 16, 1, "first", 0.5, 120.04),
                cell("width", 4, 1, "vote", 0.25, 20.0),
                cell("width", 4, 1, "q", 0.25, 20.0),
                cell("width", 4, 20, "vote", 0.9, None),
                cell("width", 4, 20, "q", 0.975, None),
            ],
        }
    }
    assert compute_table({"trm": report})[2:] == [
        "- trm: one supervision step of one puzzle 1.5e+09 FLOPs, the value head 256, state noise σ = 0.3; times "
        "over 4 puzzles solved one at a time",
        "",
        "One trajectory, by supervision steps:",
        "",
        "| model | 1 | 16 |",
        "|---|---|---|",
        "| trm | 12.5% | 50.0% |",
        "| trm, ms / puzzle | 6.0 | 120.0 |",
        "",
        "Samples at a fixed depth, by the number of samples:",
        "",
        "| model | steps | select | 1 | 20 |",
        "|---|---|---|---|---|",
        "| trm | 4 | vote | 25.0% | 90.0% |",
        "| trm | 4 | q | 25.0% | 97.5% |",
        "| trm | 4 | ms / puzzle | 20.0 | - |",
    ]


def test_eval_measures_the_grid_and_draws_it(gram_run, capsys):
    code = main(
        ["eval", str(gram_run), "--samples", "2", "--steps", "2", "--limit", "3", "--steps-grid", "1,2",
         "--samples-grid", "1,2", "--width-depths", "2", "--timing-puzzles", "1", "--json"]
    )  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    cells = report["compute"]["cells"]
    assert len(cells) == 2 + 2 * 3 and report["flops_per_puzzle"] == 2 * 2 * report["inference_flops"]["step"]
    assert (gram_run / "eval_compute.png").is_file()
    assert "| gram | 2 | value |" in (gram_run / "eval.md").read_text()
    assert main(["eval", str(gram_run), "--steps-grid", "1,x"]) == 2
    assert "--steps-grid" in capsys.readouterr().err


def _experiment(folder, **evaluation):
    for arch in ("gram", "trm"):
        run = tiny_run(
            TINY_REASONER, arch=arch, train={"steps": 2, "eval_size": 0}, task={"name": "nqueens", "n": 5}
        )
        (folder / f"{arch}.yaml").write_text(yaml.safe_dump(run))
    spec = {
        "description": "tiny",
        "models": {"gram": {"config": "gram.yaml"}, "trm": {"config": "trm.yaml"}},
        "eval": {"samples": 2, "steps": 2, "limit": 3, **evaluation},
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_an_experiment_reports_the_grid_of_every_model(tmp_path):
    grid = {"steps_grid": [1, 2], "samples_grid": [1, 2], "width_depths": [2], "state_noise": 0.3}
    path = _experiment(tmp_path, timing_puzzles=1, **grid)
    out = tmp_path / "out"
    results = run_experiment(load_experiment(path), out, progress=False, log=lambda _: None)
    for name in ("gram", "trm"):  # TRM's widths come from its noisy state, GRAM's from its own noise
        cells = results["models"][name]["eval"]["compute"]["cells"]
        assert [c["curve"] for c in cells] == ["depth"] * 2 + ["width"] * 6
    assert results["models"]["trm"]["eval"]["compute"]["state_noise"] == 0.3
    assert results["models"]["gram"]["eval"]["compute"]["state_noise"] == 0.0
    report = (out / "report.md").read_text()
    assert "| trm | 2 | q |" in report and "| gram | 2 | value |" in report
    assert (
        "| model | 1 | 2 |" in report
        and "| trm, ms / puzzle |" in report
        and "| gram, ms / puzzle |" in report
    )
    assert (out / "compute.png").stat().st_size > 0
    logged = []
    again = run_experiment(load_experiment(path), out, progress=False, log=logged.append)
    assert again["models"] == results["models"] and sum("evaluated already" in line for line in logged) == 2
    with pytest.raises(UsageError, match=r"eval\.samples_grid"):
        load_experiment(_experiment(tmp_path, samples_grid=[1, 2]))
