import itertools

import numpy as np
import pytest
import torch

from latentloop.errors import UsageError
from latentloop.tasks import get_task
from latentloop.tasks.permutations import ELEMENTS, LETTERS, Word, compose


def apply(permutation, objects):
    """Where each object lands: object j goes to place permutation[j]."""
    out = [None] * 3
    for j, item in enumerate(objects):
        out[permutation[j]] = item
    return out


def test_the_documented_example_is_solved_by_hand():
    task = get_task("permutations")
    word = task.parse("bdf=")
    # b = 021, then d = 120: 0 -> 0 -> 1, 1 -> 2 -> 0, 2 -> 1 -> 2, i.e. 102 = c; then f = 210: 102 -> 120 = d.
    assert word.prefix_products() == [LETTERS.index("b"), LETTERS.index("c"), LETTERS.index("d")]
    assert task.answer(word) == "d"
    assert task.prompt(word) == "bdf="
    assert task.format(word, pretty=True) == "021 120 210 = ?"


def test_composition_is_applying_one_permutation_after_the_other():
    objects = ["x", "y", "z"]
    for i, j in itertools.product(range(6), repeat=2):
        moved = apply(ELEMENTS[j], apply(ELEMENTS[i], objects))
        assert moved == apply(ELEMENTS[compose(i, j)], objects)


def test_the_order_of_the_letters_decides_the_product():
    task = get_task("permutations")
    assert task.answer(task.parse("bc=")) != task.answer(task.parse("cb="))  # S3 is not commutative
    assert task.answer(task.parse("a=")) == "a"  # the identity
    assert task.answer(task.parse("bb=")) == "a"  # a transposition undoes itself
    assert task.answer(task.parse("ddd=")) == "a"  # a 3-cycle three times


def test_verifier_accepts_the_product_and_rejects_everything_else():
    task = get_task("permutations")
    assert task.verify("bdf=", "d")
    assert task.verify("bdf=", " d ")
    assert task.verify("bdf", LETTERS.index("d"))
    for wrong in ("a", "b", "c", "e", "f", "dd", "", "D"):
        assert not task.verify("bdf=", wrong)
    assert not task.verify("bdf=", LETTERS.index("c"))
    # one letter changed anywhere changes the product
    assert not task.verify("bdc=", "d")
    assert not task.verify("adf=", "d")


@pytest.mark.parametrize("bad", ["", "=", "abg=", "ab1=", "a" * 201])
def test_bad_prompts_get_one_line(bad):
    task = get_task("permutations")
    with pytest.raises(UsageError) as info:
        task.parse(bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "options",
    [{"length": "0-4"}, {"length": "8-4"}, {"length": "x"}, {"test_length": "1-500"}, {"length_warmup": -1}],
)
def test_bad_options_get_one_line(options):
    with pytest.raises(UsageError) as info:
        get_task("permutations", **options)
    assert "\n" not in str(info.value)


def test_products_are_uniform_so_guessing_gets_one_in_six():
    task = get_task("permutations", length="5-5")
    rng = np.random.default_rng(0)
    counts = np.bincount([task.random_problem(rng).product() for _ in range(6000)], minlength=6)
    assert counts.min() > 900 and counts.max() < 1100


def test_held_out_words_are_disjoint_from_training_and_lie_in_their_tier():
    task = get_task("permutations", length="1-8", test_length="10-12", test_size=50)
    tests = task.test_problems()
    assert len(tests) == 50
    assert all(10 <= len(w.letters) <= 12 and task.is_test(w) for w in tests)
    rng = np.random.default_rng(1)
    train = [task.sample_train(rng) for _ in range(500)]
    assert not any(task.is_test(w) for w in train)
    assert all(1 <= len(w.letters) <= 8 for w in train)


def test_the_curriculum_grows_the_longest_word_with_the_step():
    task = get_task("permutations", length="2-20", length_warmup=100)
    assert task.length_range_at(0) == (2, 2)
    assert task.length_range_at(50) == (2, 11)
    assert task.length_range_at(100) == (2, 20)
    assert task.length_range_at(None) == (2, 20)
    rng = np.random.default_rng(0)
    assert all(len(task.random_problem(rng, "train", 0).letters) == 2 for _ in range(20))


def test_batches_label_only_the_answer_and_eos():
    task = get_task("permutations", length="3-6")
    inputs, labels = task.train_batch(step=7, batch_size=8)
    assert inputs.shape == labels.shape == (8, task.seq_len)
    again_inputs, _ = task.train_batch(step=7, batch_size=8)
    assert (inputs == again_inputs).all()  # a pure function of (seed, step)
    for row_in, row_lab in zip(inputs.tolist(), labels.tolist(), strict=True):
        scored = [i for i, t in enumerate(row_lab) if t != -100]
        assert len(scored) == 2  # the product's letter, then <eos>
        prompt = task.decode(row_in[: scored[0] + 1])
        assert prompt.endswith("=")
        assert task.verify(prompt, task.tokenizer.decode([row_lab[scored[0]]]))


def test_word_is_hashable_for_the_held_out_set():
    assert len({Word((1, 2)), Word((1, 2)), Word((2, 1))}) == 2


def test_prefix_labels_name_the_product_so_far_at_every_letter_and_only_in_training():
    task = get_task("permutations", length="3-6", prefix_labels=True)
    inputs, labels = task.train_batch(step=2, batch_size=8)
    plain_inputs, plain_labels = get_task("permutations", length="3-6").train_batch(step=2, batch_size=8)
    assert (inputs == plain_inputs).all()  # the same words
    answer = plain_labels != -100
    assert (labels[answer] == plain_labels[answer]).all()  # the answer and <eos> keep their labels
    for row_in, row_lab in zip(inputs.tolist(), labels.tolist(), strict=True):
        word = task.parse(task.decode(row_in).split("=")[0])
        products = [LETTERS[v] for v in word.prefix_products()]
        n = len(word.letters)
        assert task.tokenizer.decode(row_lab[:n]) == "".join(products)
        assert all(t == -100 for t in row_lab[n + 3 :])  # padding unscored
    _, held_labels, _ = next(task.heldout_batches(8))
    assert ((held_labels != -100).sum(-1) == 2).all()  # held out: the answer and <eos> only


def test_prefix_labels_must_be_a_boolean():
    with pytest.raises(UsageError, match="prefix_labels"):
        get_task("permutations", prefix_labels="maybe")


def test_label_work_counts_the_letters_each_label_composes():
    task = get_task("permutations", length="1-5", prefix_labels=True)
    # "bdf=" then its answer "d": letters 1, 2, 3, the answer at "=" composes all 3, the answer read back
    # (labelled <eos>) composes none, and so does padding.
    inputs, labels = task.collate([Word((1, 3, 5)), Word((4,))])
    work = task.label_work(inputs)
    assert task.decode(inputs[0]) == "bdf=d"
    assert work.tolist() == [[1, 2, 3, 3, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]]
    assert work.shape == labels.shape


def test_tasks_without_label_work_say_so():
    with pytest.raises(UsageError, match="work of its labels"):
        get_task("arithmetic").label_work(torch.zeros(1, 4, dtype=torch.long))


def test_held_out_prefix_labels_are_the_running_products_and_only_with_prefix_labels():
    task = get_task("permutations", length="1-5", prefix_labels=True)
    problems = [Word((1, 3, 5)), Word((4,))]
    _, labels = task.collate(problems)
    prefixed = task.prefix_labels_of(problems, labels)
    assert task.decode(prefixed[0, :3]) == "bcd" and task.decode(prefixed[1, :1]) == "e"
    assert (prefixed[0, 3:] == labels[0, 3:]).all() and (prefixed[1, 1:] == labels[1, 1:]).all()
    assert (labels[0, :3] == -100).all()  # the labels given are left as they were
    assert get_task("permutations", length="1-5").prefix_labels_of(problems, labels) is None
