"""``latentloop sample``: unconditional samples of tiny trained reasoners (digits and Sudoku), scores, the PNG
grid, repeatable seeds, and one-line errors with exit 2 on bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from latentloop.cli import main
from latentloop.eval.generation import sample_blanks
from latentloop.infer.runs import load_run
from latentloop.train.checkpoint import latest_checkpoint
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config, build_run_config
from tests.tiny import TINY_LM, TINY_REASONER, tiny_run


def _train_tiny(out: Path, arch: str, task: dict) -> Path:
    """Two batches of the tiny reasoner on ``task`` (a few small datasets rows; seconds)."""
    data = copy.deepcopy(TINY_REASONER)
    data["task"] = task
    data["train"].update(steps=2, eval_size=0, augment=False, train_size=32, test_size=8)
    train(build_reasoner_config(data, arch=arch), out)
    return out


def _loud_prior(run: Path) -> None:
    """Widen GRAM's prior noise to σ ≈ 5 in the checkpoint. Two training steps leave the EMA weights at their
    initialisation, whose σ = 0.1 noise rarely flips an argmax; a wide prior shows that every sample draws
    its own noise through the whole command."""
    weights = latest_checkpoint(run) / "model.safetensors"
    state = load_file(str(weights))
    bias = state["prior.proj.bias"]
    bias[bias.shape[0] // 2 :] = 5.0
    save_file(state, str(weights))


@pytest.fixture(scope="module")
def digits_gram(tmp_path_factory) -> Path:
    run = _train_tiny(tmp_path_factory.mktemp("gram") / "run", "gram", {"name": "digits"})
    _loud_prior(run)
    return run


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_digits_gram_png_json_and_scores(digits_gram, tmp_path, capsys) -> None:
    png = tmp_path / "grid.png"
    code, out, _ = _run(capsys, "sample", digits_gram, "--n", "12", "--out", png, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["model"] == "gram" and report["task"] == "digits" and report["samples"] == 12
    assert report["samples_per_s"] > 0 and report["steps"] == TINY_REASONER["model"]["n_sup"]
    assert report["distinct"] >= 2  # GRAM's samples differ: each draws its own prior noise
    for key in ("scores", "reference"):
        assert set(report[key]) == {
            "images",
            "inception_score",
            "frechet_distance",
            "classifier_test_accuracy",
        }
        assert report[key]["images"] == 12 and report[key]["inception_score"] >= 1.0
        assert report[key]["frechet_distance"] >= 0.0 and report[key]["classifier_test_accuracy"] > 0.85
    assert report["image"] == str(png)
    import matplotlib.image

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and matplotlib.image.imread(png).ndim == 3
    assert not [p for p in tmp_path.iterdir() if p.name != "grid.png"]  # no temporary file left behind

    code, out, _ = _run(capsys, "sample", digits_gram, "--n", "4", "--steps", "1")
    assert code == 0
    assert "inception score" in out and "Fréchet distance" in out and "samples/s" in out
    assert (digits_gram / "samples.png").is_file()  # the default --out: the run folder


def test_same_seed_same_samples(digits_gram) -> None:
    model, task, _, _ = load_run(digits_gram)

    def draw(seed: int) -> np.ndarray:
        torch.manual_seed(seed)
        return sample_blanks(model, task, 6, steps=1, batch_size=4)[0]

    first = draw(0)
    assert first.shape == (6, 64)
    assert np.array_equal(first, draw(0)) and not np.array_equal(first, draw(1))


@pytest.mark.parametrize("arch", ["mdlm", "ar"])
def test_generative_baselines(arch, tmp_path, capsys) -> None:
    run = _train_tiny(tmp_path / arch, arch, {"name": "digits"})
    steps = ["--steps", "3"] if arch == "mdlm" else []
    code, out, _ = _run(capsys, "sample", run, "--n", "5", *steps, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["model"] == arch and report["steps"] == (3 if arch == "mdlm" else 1)
    assert "temperature" in report and "scores" in report and Path(report["image"]).is_file()


def test_sudoku_boards_are_judged_by_the_verifier(tmp_path, capsys) -> None:
    run = _train_tiny(tmp_path / "sudoku", "gram", {"name": "sudoku", "n": 4})
    code, out, _ = _run(capsys, "sample", run, "--n", "6", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["task"] == "sudoku" and 0.0 <= report["valid_fraction"] <= 1.0
    assert len(report["examples"]) == 3 and "image" not in report and "scores" not in report
    code, out, err = _run(capsys, "sample", run, "--out", tmp_path / "x.png")
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, digits_gram) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    (root / "empty").mkdir()
    (root / "a_file").write_text("not a folder\n")
    lm = tiny_run(TINY_LM, train={"steps": 1, "eval_size": 0})
    train(build_run_config(lm), root / "lm", progress=False)
    _train_tiny(root / "nqueens", "gram", {"name": "nqueens", "n": 5})
    return {"root": root, "gram": digits_gram}


@pytest.mark.parametrize(
    "argv",
    [
        ["{root}/missing"],
        ["{root}/empty"],
        ["{root}/lm"],
        ["{root}/nqueens"],
        ["{gram}", "--n", "0"],
        ["{gram}", "--n", "-3"],
        ["{gram}", "--steps", "0"],
        ["{gram}", "--out", "{root}/a_file/grid.png"],
        ["{gram}", "--out", "{root}/grid.jpg"],
        ["{gram}", "--out", "{root}"],
        ["{gram}", "--n", "lots"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(bad_runs, argv, capsys) -> None:
    args = [a.format(root=bad_runs["root"], gram=bad_runs["gram"]) for a in argv]
    code, out, err = _run(capsys, "sample", *args)
    assert code == 2 and out == "", (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
