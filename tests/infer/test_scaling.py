"""Width and depth scaling: selection rules, batched samples, halting; eval and solve end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.eval.reasoners import evaluate_model, markdown_table
from latentloop.infer.scaling import select_sample, solve
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.tasks.base import get_task


def test_vote_selects_the_most_frequent_answer():
    assert select_sample(["a", "b", "b", "c", "b", "a"], [0.9, 0.1, 0.1, 0.2, 0.1, 0.9], "vote") == 1
    assert select_sample(["x", "y", "y"], None, "vote") == 1
    assert select_sample(["p", "q"], None, "vote") == 0  # a tie goes to the answer seen first


def test_value_selects_the_highest_value_and_first_the_first():
    assert select_sample(["a", "a", "b"], [0.2, 0.3, 0.8], "value") == 2
    assert select_sample(["a", "b", "c"], [0.2, 0.9, 0.8], "first") == 0
    with pytest.raises(UsageError):
        select_sample(["a"], [1.0], "best")


def _model(arch: str):
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=3, seq_len=16, dim=16, n_heads=2, n_layers=1, hidden=32, n_sup=3, cycles=2, inner=2
    )
    model = build_reasoner(arch, config)
    if arch == "gram":
        torch.nn.init.normal_(model.prior.proj.weight, std=0.5)  # visible noise, so samples disagree
    return model


def test_solve_shapes_and_sample_diversity():
    x = torch.randint(1, 3, (4, 16))
    result = solve(_model("gram"), x, steps=3, samples=5, select="value")
    assert result.predictions.shape == (3, 5, 4, 16) and result.values.shape == (3, 5, 4)
    assert not result.values.requires_grad, "inference builds no autograd graph"
    assert not torch.equal(result.values[:, 0], result.values[:, 1]), "GRAM samples draw their own noise"
    best = result.values[-1].argmax(0)
    assert torch.equal(result.chosen_sample, best)
    assert torch.equal(result.chosen, result.predictions[-1, best, torch.arange(4)])
    det = solve(_model("trm"), x, steps=2, samples=3)
    assert torch.equal(det.predictions[:, 0], det.predictions[:, 1]) and torch.equal(
        det.values[:, 0], det.values[:, 2]
    )


def test_gram_samples_at_temperature_zero_agree_and_a_negative_temperature_is_refused():
    x = torch.randint(1, 3, (2, 16))
    model = _model("gram")
    cold = solve(model, x, steps=2, samples=3, temperature=0.0)
    assert torch.equal(cold.predictions[:, 0], cold.predictions[:, 2])
    assert torch.equal(cold.values[:, 0], cold.values[:, 1])
    for arch in ("gram", "trm"):
        with pytest.raises(UsageError, match="temperature"):
            solve(_model(arch), x, samples=2, temperature=-0.5)


def test_deterministic_models_run_one_trajectory_for_all_samples():
    x = torch.randint(1, 3, (2, 16))
    model = _model("hrm")
    batch_sizes = []
    model.register_forward_pre_hook(lambda _, args: batch_sizes.append(args[1]["inputs"].shape[0]))
    wide = solve(model, x, steps=2, samples=3, halt=True)
    assert batch_sizes and set(batch_sizes) == {2}, "the samples would all be equal: one run is enough"
    single = solve(model, x, steps=2, samples=1, halt=True)
    assert wide.predictions.shape == (2, 3, 2, 16) and wide.halted_at.shape == (3, 2)
    for k in range(3):
        assert torch.equal(wide.predictions[:, k], single.predictions[:, 0])
        assert torch.equal(wide.values[:, k], single.values[:, 0])
        assert torch.equal(wide.halted_at[k], single.halted_at[0])


def test_halting_freezes_answers():
    model = _model("hrm")
    x = torch.randint(1, 3, (2, 16), generator=torch.Generator().manual_seed(0))
    free = solve(model, x, steps=4, samples=2)
    # This model's answers change after the first step, so an answer frozen at step 1 differs from the last.
    assert not torch.equal(free.predictions[0], free.predictions[-1])
    torch.nn.init.constant_(model.halt_head.proj.bias, 10.0)  # always halt after the first step
    result = solve(model, x, steps=4, samples=2, halt=True)
    assert (result.halted_at == 1).all()
    for step in range(4):
        assert torch.equal(result.predictions[step], free.predictions[0])
        assert torch.equal(result.values[step], free.values[0])


def test_solve_rejects_a_puzzle_of_the_wrong_size():
    with pytest.raises(UsageError, match="16"):
        solve(_model("trm"), torch.ones(1, 9, dtype=torch.long))


def test_evaluation_with_halting_keeps_each_samples_answer_from_its_halting_step():
    task = get_task("nqueens", n=4)
    model = _model("looped")
    torch.nn.init.constant_(model.halt_head.proj.bias, 10.0)  # every sample halts after its first step
    inputs = np.stack([task.encode(task.parse("." * 16))] * 2).astype(np.int64)
    report = evaluate_model(model, task, inputs, samples=2, steps=3, halt=True, progress=False)
    assert report["halt"] and report["mean_halt_step"] == 1.0
    assert "halted by the Q-head" in markdown_table(report)
    plain = evaluate_model(model, task, inputs, samples=2, steps=3, progress=False)
    assert "halt" not in plain


# Command line ------------------------------------------------------------------------------------------------
TRAIN = [
    "train", "--task", "nqueens:n=5", "--model", "gram", "--steps", "2", "--quiet",
    "model.dim=16", "model.n_heads=2", "model.n_layers=1", "model.hidden=32", "model.n_sup=2",
    "model.cycles=2", "model.inner=2", "train.batch_size=8", "train.eval_size=4", "train.precision=fp32",
    "train.tensorboard=false",
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "gram"
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


def test_eval_end_to_end(run, capsys):
    assert main(["eval", str(run), "--samples", "3", "--steps", "2", "--limit", "6", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["puzzles"] == 6 and report["samples"] == 3
    assert len(report["curve_steps"]) == 2 and len(report["curve_samples"]) == 3
    assert 0 <= report["coverage"] <= 1 and 0 <= report["accuracy"] <= 1
    for name in ("eval.json", "eval.md", "eval_curves.png"):
        assert (run / name).is_file()
    assert main(["eval", str(run), "--samples", "2", "--steps", "2", "--limit", "2", "--halt", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["halt"] and 1 <= report["mean_halt_step"] <= 2


def test_solve_with_model(run, capsys):
    code = main(
        ["solve", "nqueens", "Q" + "." * 24, "--n", "5", "--model", str(run), "--samples", "2", "--json"]
    )
    payload = json.loads(capsys.readouterr().out)
    assert code == (0 if payload["valid"] else 1)
    assert len(payload["answer"]) == 25


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--task", "nqueens", "--model", "nope"], "unknown model"),
        (["train", "--task", "nope", "--model", "gram"], "unknown task"),
        (["train", "--task", "nqueens:n=5", "--model", "gram", "model.seq_len=16"], "does not fit"),
        (["solve", "nqueens", "Q" + "." * 35, "--n", "6", "--model", "RUN"], "puzzles of 25 tokens"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, run, tmp_path, capsys):
    argv = [str(run) if a == "RUN" else a for a in argv]
    if argv[0] == "train":
        argv += ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_eval_of_a_folder_without_checkpoint(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("spec", [{"name": "graph-coloring", "n": 5}, {"name": "sudoku", "box": "2x2"}])
def test_evaluate_model_reports_task_metrics(spec):
    import itertools

    import numpy as np

    from latentloop.eval.reasoners import evaluate_model
    from latentloop.tasks.base import get_task

    options = {k: v for k, v in spec.items() if k != "name"}
    task = get_task(spec["name"], **options)
    rows = list(itertools.islice(task.records("test", 0, 3), 3))
    inputs = np.stack([r[0] for r in rows]).astype(np.int64)
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=task.vocab_size, seq_len=task.seq_len, dim=16, n_heads=2, n_layers=1, hidden=32, n_sup=2
    )
    report = evaluate_model(build_reasoner("gram", config), task, inputs, samples=3, select="value")
    assert report["puzzles"] == 3 and [p["steps"] for p in report["curve_steps"]] == [1, 2]
    assert ("coverage" in report) == (task.name == "graph-coloring")
    if task.name == "graph-coloring":
        assert report["conflicts_total"] >= 0 and len(report["curve_samples"][0]) == 4
