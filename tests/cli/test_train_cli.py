"""``latentloop train`` and ``latentloop eval`` end to end, with a tiny model."""

from __future__ import annotations

import json

import pytest
import yaml

from latentloop.cli import main
from tests.tiny import TINY_LM, tiny_run

TINY = tiny_run(TINY_LM, train={"steps": 3, "warmup_steps": 1}, task={"test_size": 16})


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_train_then_eval_json(config_file, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--config", str(config_file), "--out", str(out), "--json", "--quiet"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 3 and result["stopped"] == "steps" and result["precision"] == "fp32"
    assert (out / "config.yaml").is_file() and (out / "metrics.jsonl").is_file()

    # Running again resumes and extends the schedule with --steps.
    assert (
        main(["train", "--config", str(config_file), "--out", str(out), "--steps", "4", "--json", "-q"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["resumed_from"] == 3 and result["step"] == 4

    assert main(["eval", str(out), "--depths", "1,2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["num_steps"] for r in report["results"]] == [1, 2]
    assert (
        main(["eval", str(out), "--num-steps", "1,2", "--json"]) == 0
    )  # the deprecated spelling still works
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"] == report["results"]
    assert "--num-steps is deprecated here and will be removed; use --depths" in captured.err
    width = ["eval", str(out), "--depths", "2", "--init-scale", "1", "--limit", "4", "--json"]
    assert main([*width, "--num-samples", "2"]) == 0
    voted = json.loads(capsys.readouterr().out)["results"]
    assert main([*width, "--samples", "2"]) == 0  # a language model's trajectories, by their earlier name
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"] == voted and "use --num-samples" in captured.err
    assert report["step"] == 4 and (out / "eval_depth.png").is_file()

    assert main(["eval", str(out / "checkpoints" / "step_00000004"), "--depths", "1", "--limit", "4"]) == 0
    text = capsys.readouterr().out
    assert "| depth (num_steps) | exact match | problems |" in text and "| 1 |" in text


def test_positional_config_overrides_and_default_out(config_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["train", str(config_file), "train.steps=2", "model.n_embd=16", "task.digits=1", "-q"])
    assert code == 0
    assert "to step 2" in capsys.readouterr().out
    saved = yaml.safe_load((tmp_path / "runs" / "arithmetic-recurrent-depth" / "config.yaml").read_text())
    assert saved["model"]["n_embd"] == 16 and saved["task"]["digits"] == 1


def test_non_interactive_runs_print_log_lines(config_file, tmp_path, capsys):
    assert (
        main(["train", "--config", str(config_file), "--out", str(tmp_path / "r"), "train.log_every=1"]) == 0
    )
    err = capsys.readouterr().err
    assert "step      1  loss" in err and "tok/s" in err


def test_train_says_how_long_its_schedule_takes_once_it_has_timed_its_first_steps(
    config_file, tmp_path, capsys
):
    assert main(["train", "--config", str(config_file), "--out", str(tmp_path / "r"), "--steps", "40"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "take about" in line]
    assert (
        len(lines) == 1
        and lines[0].startswith("the 40 steps take about ")
        and lines[0].endswith(" min on this machine")
    )


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--model", "transformer-xl"],
        ["train", "--task", "chess"],
        ["train", "model.n_embd=abc"],
        ["train", "model.width=3"],
        ["train", "task.base=16"],
        ["train", "stray-word"],
        ["train", "--config", "/nonexistent.yaml"],
        ["eval", "/nonexistent-run"],
    ],
)
def test_bad_input_exits_2_with_one_line(args, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    _error_line(capsys)


def test_eval_rejects_bad_depths_and_empty_runs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(tmp_path / "empty")]) == 2
    assert "checkpoint" in _error_line(capsys)
    assert main(["eval", str(tmp_path / "empty"), "--depths", "1,x"]) == 2
    assert "--depths" in _error_line(capsys)
    assert main(["eval", str(tmp_path / "empty"), "--depths", "0"]) == 2
    _error_line(capsys)
