"""Evaluation reports: the example answers kept (and drawn) for each model, seeding, progress."""

from __future__ import annotations

import json

import numpy as np
import torch

from latentloop.eval.reasoners import evaluate_reasoner, example_answers, markdown_table


def test_example_answers_put_solved_puzzles_first_then_the_most_solutions_found():
    inputs = np.arange(5 * 3).reshape(5, 3)
    # 2 samples of 5 puzzles: predictions [K, B, L], violations and answer identities [K, B].
    predictions = np.arange(2 * 5 * 3).reshape(2, 5, 3)
    violations = np.array([[1, 0, 0, 2, 0], [1, 0, 3, 0, 0]])
    key_ids = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    chosen = np.array([0, 1, 0, 0, 1])  # puzzle 3's chosen answer is broken, though sample 1 solved it
    examples = example_answers(inputs, predictions, violations, key_ids, chosen, np.array([1, 2, 1, 1, 3]), 4)
    # Solved first (1 and 4 found 2 answers, 2 found 1), then the broken ones by answers found (3 before 0).
    assert [e["index"] for e in examples] == [1, 4, 2, 3]
    assert [e["violations"] for e in examples] == [0, 0, 0, 2]
    assert examples[0]["answer"] == predictions[1, 1].tolist() and examples[0]["puzzle"] == [3, 4, 5]
    assert examples[1]["valid_found"] == 2 and examples[1]["solutions"] == 3


def test_example_answers_of_single_solution_tasks_have_no_solution_count():
    examples = example_answers(
        np.zeros((2, 3)), np.zeros((1, 2, 3)), np.zeros((1, 2)), np.zeros((1, 2)), np.zeros(2, int), None, 1
    )
    assert len(examples) == 1 and "solutions" not in examples[0]


def test_evaluation_is_reproducible_from_its_seed_and_keeps_the_callers_rng(gram_run):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    # Two training steps leave GRAM's prior noise at σ = 0.1, which rarely flips an argmax; at temperature
    # 50 (σ = 5) every seed draws visibly different answers.
    reports = [
        evaluate_reasoner(gram_run, samples=3, steps=2, seed=s, temperature=50.0, write=False)
        for s in (7, 7, 8)
    ]
    assert torch.equal(torch.rand(1), expected_next)  # evaluation drew from its own generator state
    answers = [[e["answer"] for e in r["examples"]] for r in reports]
    assert reports[0] == reports[1]  # the same seed: the same report, every number and answer
    assert answers[0] != answers[2]  # another seed: other noise, other answers
    assert reports[0]["seed"] == 7 and reports[2]["seed"] == 8


def test_the_progress_bar_counts_every_puzzle_on_stderr_only_when_asked(gram_run, capsys):
    report = evaluate_reasoner(
        gram_run, samples=2, steps=1, write=False, progress=True, label="gram: evaluating"
    )
    err = capsys.readouterr().err
    assert "gram: evaluating" in err and f"0/{report['puzzles']}" in err  # the bar's total: every puzzle
    evaluate_reasoner(gram_run, samples=2, steps=1, write=False, progress=False)
    assert capsys.readouterr().err == ""


def test_a_run_with_a_validation_split_evaluates_there_and_keeps_test_for_the_report(tmp_path):
    from latentloop.data.dataset import load_dataset
    from latentloop.eval.reasoners import unique_puzzles
    from latentloop.train.loop import train
    from latentloop.train.run_config import build_reasoner_config
    from tests.tiny import TINY_REASONER, tiny_run

    run = tmp_path / "run"
    data = tiny_run(TINY_REASONER, arch="gram", model={"cycles": 1, "inner": 1}, train={"steps": 2})
    data["train"]["validation"] = 3
    train(build_reasoner_config(data), run)
    dataset = load_dataset(run / "data")
    held = {bytes(x) for x in unique_puzzles(dataset.split("validation"), None)}
    assert len(held) == 3 and not held & {bytes(x) for x in dataset.split("train")["inputs"]}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records if r["kind"] == "eval"] == ["validation"]  # tuned on, not test

    validation = evaluate_reasoner(run, samples=2, steps=1, write=False, split="validation")
    test = evaluate_reasoner(run, samples=2, steps=1, write=False)
    assert validation["split"] == "validation" and validation["puzzles"] == 3
    assert "split" not in test and test["puzzles"] == dataset.metadata["counts"]["test"]["puzzles"]
    # eval.md names the split it scored
    assert "(3 validation puzzles," in markdown_table(validation).splitlines()[0]
    assert f"({test['puzzles']} test puzzles," in markdown_table(test).splitlines()[0]
