"""The arithmetic task: format, labels, verifier, disjoint splits, deterministic batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latentloop.errors import UsageError
from latentloop.tasks.arithmetic import ArithmeticTask, Problem
from latentloop.tasks.base import get_task


def test_registry_builds_the_task_with_string_options():
    task = get_task("arithmetic", digits="4", ops="+-")
    assert isinstance(task, ArithmeticTask)
    assert task.digits == 4 and task.ops == ("+", "-")


def test_format_is_fixed_width_msd_first():
    task = ArithmeticTask(digits=4, ops="+-*")
    assert task.prompt(Problem(347, 589, "+")) == "0347+0589="
    assert task.answer(Problem(347, 589, "+")) == "00936"
    assert task.answer(Problem(9999, 9999, "+")) == "19998"
    assert task.answer(Problem(347, 589, "-")) == "-0242"
    assert task.answer(Problem(589, 347, "-")) == "+0242"
    assert task.answer(Problem(12, 34, "*")) == "00000408"


def test_labels_cover_exactly_the_answer_and_end_marker():
    task = ArithmeticTask(digits=3)
    problem = Problem(347, 589, "+")
    inputs, labels = task.encode_example(problem)
    assert len(inputs) == len(labels) == task.seq_len
    full = [*task.tokenizer.encode("347+589=0936"), task.tokenizer.eos_id]
    assert inputs == full[:-1]
    prompt_len = len("347+589=")
    assert labels[: prompt_len - 1] == [-100] * (prompt_len - 1)
    # Labels are aligned with positions: position i predicts token i + 1.
    assert labels[prompt_len - 1 :] == full[prompt_len:]
    assert task.decode(labels[prompt_len - 1 :]) == "0936"


def test_mixed_ops_pad_to_one_length():
    task = ArithmeticTask(digits=2, ops="+*")
    inputs, labels = task.collate([Problem(12, 34, "+"), Problem(12, 34, "*")])
    assert inputs.shape == labels.shape == (2, task.seq_len)
    assert inputs.dtype == torch.long
    assert int(inputs[0, -1]) == task.tokenizer.pad_id and int(labels[0, -1]) == -100
    assert int((labels[1] != -100).sum()) == 5  # 4 answer digits + <eos>


def test_verify_checks_the_arithmetic():
    task = ArithmeticTask(digits=3, ops="+-*")
    p = Problem(347, 589, "+")
    assert task.verify(p, "0936") and task.verify(p, "936") and task.verify(p, 936)
    assert task.verify(p, "0936\n") and task.verify("347+589=", "0936")
    assert not task.verify(p, "0937") and not task.verify(p, "") and not task.verify(p, "9x6")
    assert task.verify(Problem(3, 5, "-"), "-002") and not task.verify(Problem(3, 5, "-"), "+002")
    assert task.verify(Problem(999, 999, "*"), "998001")
    for problem in task.test_problems()[:50]:
        assert task.verify(problem, task.answer(problem))


def test_parse_errors_are_one_line_usage_errors():
    task = ArithmeticTask(digits=3)
    assert task.parse("12+7") == Problem(12, 7, "+")
    for bad in ("12+", "a+b", "1234+1", "3*4"):
        with pytest.raises(UsageError):
            task.parse(bad)


def test_bad_options_are_usage_errors():
    for options in ({"digits": 0}, {"digits": "x"}, {"ops": "/"}, {"test_fraction": 0}, {"test_size": -1}):
        with pytest.raises(UsageError):
            ArithmeticTask(**options)
    with pytest.raises(UsageError):
        get_task("arithmetic", width=3)


def test_train_never_sees_test_problems():
    task = ArithmeticTask(digits=2, ops="+")
    tests = set(task.test_problems())
    assert tests and all(task.is_test(p) for p in tests)
    # Two-digit addition has 10,000 problems: enumerate, so the test set is the whole bucket.
    bucket = {Problem(a, b, "+") for a in range(100) for b in range(100) if task.is_test(Problem(a, b, "+"))}
    assert tests == bucket
    assert 0.02 < len(bucket) / 10_000 < 0.08
    rng = np.random.default_rng(0)
    drawn = {task.sample_train(rng) for _ in range(20_000)}
    assert not drawn & tests
    assert len(drawn) > 8000  # training covers the rest of the space


def test_test_set_is_fixed_and_sampled_for_large_spaces():
    a, b = ArithmeticTask(digits=6, test_size=200), ArithmeticTask(digits=6, test_size=200)
    assert a.test_problems() == b.test_problems()
    assert len(a.test_problems()) == 200 == len(set(a.test_problems()))
    examples = list(a.examples("test"))
    assert examples[0] == (a.test_problems()[0], a.answer(a.test_problems()[0]))


def test_train_batches_are_a_function_of_seed_and_step():
    task = ArithmeticTask(digits=3)
    x1, y1 = task.train_batch(5, 16, seed=1)
    x2, y2 = task.train_batch(5, 16, seed=1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, task.train_batch(6, 16, seed=1)[0])
    assert not torch.equal(x1, task.train_batch(5, 16, seed=2)[0])


def test_heldout_batches_cover_the_test_set_once():
    task = ArithmeticTask(digits=3, test_size=100)
    seen = []
    for inputs, labels, problems in task.heldout_batches(32):
        assert inputs.shape[0] == labels.shape[0] == len(problems) <= 32
        seen.extend(problems)
    assert seen == task.test_problems()
    assert len(list(task.heldout_batches(32, limit=40))) == 2
