"""A new model and a new task, each written in a file of its own (``tests/extensions/``), work through every
command: ``train``, ``eval``, ``solve`` and ``run``. Nothing in ``src/`` names them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import tests.extensions.echo_reasoner  # noqa: F401  (defining the class registers --model echo)
from latentloop.cli import main
from latentloop.families import model_names
from latentloop.tasks.base import TASKS, get_task, register_task
from tests.tiny import TINY_REASONER, tiny_run


@pytest.fixture
def flip_task():
    register_task("flip", "tests.extensions.flip_task:FlipTask")
    yield
    del TASKS["flip"]


def write_config(folder, arch: str, task: dict) -> str:
    run = tiny_run(TINY_REASONER, train={"steps": 3, "eval_size": 4}, task=task)
    path = folder / f"{arch}-{task['name']}.yaml"
    path.write_text(yaml.safe_dump({"arch": arch, **run}))
    return str(path)


def every_command(capsys, folder, config: str, task_spec: str, puzzle: str) -> dict:
    """Train, evaluate, solve with and run an experiment of the model of ``config``; returns eval's report."""
    run = folder / "run"
    assert main(["train", config, "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--samples", "2", "--steps", "2", "--limit", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["solve", task_spec, puzzle, "--model", str(run), "--json"]) in (0, 1)  # 1: unsolved
    solved = json.loads(capsys.readouterr().out)
    assert len(solved["answer"] if "answer" in solved else solved["answers"][0]) > 0
    experiment = folder / "experiment.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "description": "one model",
                "budget_minutes": 5,
                "models": {"only": {"config": config}},
                "eval": {"samples": 2, "steps": 2, "limit": 4},
            }
        )
    )
    assert main(["run", str(experiment), "--out", str(folder / "experiment"), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["models"]["only"]["train"]["step"] == 3
    return report


def test_a_reasoner_in_a_file_of_its_own_works_through_every_command(tmp_path, capsys):
    assert "echo" in model_names()
    config = write_config(tmp_path, "echo", {"name": "nqueens", "n": 5})
    task = get_task("nqueens", n=5)
    puzzle = task.format(next(iter(task.examples("test")))[0])
    report = every_command(capsys, tmp_path, config, "nqueens:n=5", puzzle)
    assert report["model"] == "echo" and report["puzzles"] == 4


def test_a_task_in_a_file_of_its_own_works_through_every_command(tmp_path, capsys, flip_task):
    config = write_config(tmp_path, "trm", {"name": "flip", "n": 6})
    report = every_command(capsys, tmp_path, config, "flip:n=6", "011010")
    assert report["task"] == "flip" and report["puzzles"] == 4
    # The verifier judged the answers: a model's accuracy is the share of boards that flip their input.
    boards = [np.asarray(e["answer"]) for e in report["examples"]]
    puzzles = [np.asarray(e["puzzle"]) for e in report["examples"]]
    flipped = [bool(np.all(b + p == 3)) for b, p in zip(boards, puzzles, strict=True)]
    assert [e["violations"] == 0 for e in report["examples"]] == flipped
