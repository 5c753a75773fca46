import numpy as np
import pytest
import torch

from latentloop.errors import UsageError
from latentloop.tasks import get_task
from latentloop.tasks.chains import Chains

EXAMPLE = "=5dc4a=8bb3cd9e?a="  # a = c+4 = (b+3)+4 = 15 -> 5, through b -> c -> a


def test_the_documented_example_is_solved_by_hand():
    task = get_task("chains", variables=5)
    problem = task.parse(EXAMPLE)
    assert problem.value() == 5
    assert problem.hops() == 3
    assert problem.values() == {"d": 5, "a": 5, "b": 8, "c": 1, "e": 4}
    assert task.prompt(problem) == EXAMPLE
    assert task.format(problem, pretty=True) == "d=5, a=c+4, b=8, c=b+3, e=d+9; a = ?"


def test_verifier_accepts_the_value_and_rejects_everything_else():
    task = get_task("chains", variables=5)
    assert task.verify(EXAMPLE, "5")
    assert task.verify(EXAMPLE, 5)
    assert not task.verify(EXAMPLE, "4")
    assert not task.verify(EXAMPLE, "15")  # the unreduced sum is wrong: values are mod 10
    assert not task.verify(EXAMPLE, 6)
    assert not task.verify(EXAMPLE, "5a")
    assert not task.verify(EXAMPLE, "")


def test_only_the_asked_chain_decides_the_answer():
    task = get_task("chains", variables=5)
    off_chain = task.parse("=6dc4a=8bb3cd1e?a=")  # the distractor chain d -> e changed
    on_chain = task.parse("=5dc4a=8bb2cd9e?a=")  # one increment on b -> c -> a changed
    root = task.parse("=5dc4a=9bb3cd9e?a=")
    assert off_chain.value() == 5
    assert on_chain.value() == 4
    assert root.value() == 6


@pytest.mark.parametrize("hops", ["1-1", "3-5", "8-8"])
def test_drawn_problems_have_the_asked_hops_and_every_variable_once(hops):
    task = get_task("chains", variables=8, hops=hops, test_size=50)
    low, high = (int(h) for h in hops.split("-"))
    rng = np.random.default_rng(1)
    for _ in range(200):
        problem = task.sample_train(rng)
        names = [s[0] for s in problem.statements]
        assert len(names) == len(set(names)) == 8
        assert low <= problem.hops() <= high
        assert task.parse(task.prompt(problem)) == problem
        assert len(task.encode(problem)) + 1 <= task.seq_len  # prompt + answer digit fit, <eos> is a label
    assert {p.hops() for p in task.test_problems()} <= set(range(low, high + 1))


def test_the_hop_curriculum_grows_the_longest_chain_with_the_step():
    task = get_task("chains", variables=12, hops="2-10", hops_warmup=800)
    assert [task.hop_range_at(s) for s in (0, 100, 400, 799, 800, 5000)] == [
        (2, 2),
        (2, 3),
        (2, 6),
        (2, 9),
        (2, 10),
        (2, 10),
    ]
    assert task.hop_range_at(None) == (2, 10)  # outside training: the whole range
    assert {task.random_problem(np.random.default_rng(i), "train", 0).hops() for i in range(50)} == {2}
    batch = task.train_batch(400, 64, seed=1)
    assert torch.equal(batch[0], task.train_batch(400, 64, seed=1)[0])
    assert get_task("chains", hops="2-10").hop_range_at(0) == (2, 10)  # no warmup: no curriculum


def test_the_statement_curriculum_starts_small_and_reaches_the_full_prompt():
    task = get_task("chains", variables=12, hops="1-9", hops_warmup=800, warmup_variables=4)
    assert [task.statements_at(s) for s in (0, 400, 800, 2000, None)] == [4, 8, 12, 12, 12]
    assert len(task.random_problem(np.random.default_rng(0), "train", 0).statements) == 4
    assert len(task.random_problem(np.random.default_rng(0), "test").statements) == 12
    # Never fewer statements than the longest chain the curriculum draws at that step.
    late = get_task("chains", variables=12, hops="1-12", hops_warmup=100, warmup_variables=2)
    assert all(late.statements_at(s) >= late.hop_range_at(s)[1] for s in range(0, 120, 7))


def test_every_hop_count_of_the_range_is_drawn():
    task = get_task("chains", variables=6, hops="2-5")
    rng = np.random.default_rng(0)
    assert {task.sample_train(rng).hops() for _ in range(300)} == {2, 3, 4, 5}


def test_train_and_test_are_disjoint_and_test_hops_set_the_held_out_tier():
    task = get_task("chains", variables=8, hops="1-4", test_hops="6-8", test_size=100)
    tests = task.test_problems()
    assert len(tests) == 100 and all(task.is_test(p) for p in tests)
    assert all(6 <= p.hops() <= 8 for p in tests)
    rng = np.random.default_rng(5)
    drawn = [task.sample_train(rng) for _ in range(500)]
    assert not any(task.is_test(p) for p in drawn)
    assert all(1 <= p.hops() <= 4 for p in drawn)


def test_labels_mark_exactly_the_answer_digit_and_eos():
    task = get_task("chains", variables=5)
    problem = task.parse(EXAMPLE)
    inputs, labels = task.collate([problem])
    scored = labels[0][labels[0] != -100].tolist()
    assert scored == [*task.tokenizer.encode("5"), task.tokenizer.eos_id]
    assert task.decode(inputs[0][: len(EXAMPLE)].tolist()) == EXAMPLE


def test_training_batches_are_a_pure_function_of_seed_and_step():
    task = get_task("chains", variables=8)
    a, b = task.train_batch(3, 16, seed=2), task.train_batch(3, 16, seed=2)
    assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(task.train_batch(4, 16, seed=2)[0].numpy(), a[0].numpy())


@pytest.mark.parametrize(
    "text, message",
    [
        ("=1a=2a?a=", "assigned twice"),
        ("b1a=3c?a=", "never assigned"),
        ("=1a?z=", "never assigned"),
        ("b1aa2b?a=", "loop"),
        ("b0a=1b?a=", "cannot read"),
        ("=1ba+b?b=", "cannot read"),
        ("=1ab=?b=", "cannot parse"),
        ("a=1", "cannot parse"),
        ("?a=", "no statements"),
    ],
)
def test_malformed_prompts_get_one_clear_error(text, message):
    with pytest.raises(UsageError, match=message):
        get_task("chains").parse(text)


@pytest.mark.parametrize(
    "options",
    [
        {"variables": 27},
        {"variables": 1},
        {"hops": "0-3"},
        {"hops": "5-3"},
        {"variables": 6, "hops": "2-7"},
        {"variables": 6, "test_hops": 9},
        {"hops": "two"},
        {"hops_warmup": -5},
        {"hops": "3-8", "warmup_variables": 2},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(UsageError, match="chains:"):
        get_task("chains", **options)


def test_a_problem_is_hashable_and_equal_by_content():
    one = Chains((("a", None, 3), ("b", "a", 2)), "b")
    assert one == Chains((("a", None, 3), ("b", "a", 2)), "b")
    assert len({one, Chains((("a", None, 3), ("b", "a", 2)), "b")}) == 1
    assert one.value() == 5
