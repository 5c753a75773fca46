"""Deep-supervision training: exact resume, the losses, the optimizer steps per supervision step."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch._dynamo.utils import counters

from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import UsageError
from latentloop.models.reasoners import build_reasoner
from latentloop.nn import Block
from latentloop.tasks.base import get_task
from latentloop.train import distributed as dist
from latentloop.train.deep_supervision import (
    SLOTS_FILE,
    HaltedReplacement,
    model_noise_seed,
    nearest_labels,
    stablemax_log_probs,
)
from latentloop.train.loop import train
from latentloop.train.puzzle_batches import train_batch
from latentloop.train.run_config import build_reasoner_config, fit_to_task
from tests.tiny import TINY_REASONER

TINY = TINY_REASONER


def config(arch="gram", model=None, **train):
    data = {**TINY, "model": {**TINY["model"], **(model or {})}, "train": {**TINY["train"], **train}}
    return build_reasoner_config(data, arch=arch)


def test_resumed_training_continues_exactly(tmp_path):
    whole = train(config(), tmp_path / "whole")
    first = train(config(), tmp_path / "split", stop_at=2)
    assert first.stopped == "stop_at" and first.step == 2
    second = train(config(), tmp_path / "split")
    assert second.resumed_from == 2
    assert len(whole.losses) == 4 * 2  # one loss per supervision step (n_sup = 2 per batch)
    assert first.losses + second.losses == whole.losses


@pytest.mark.parametrize("halting", ["bce", "q-learning"])
def test_halted_replacement_resumes_exactly_with_samples_in_flight(tmp_path, monkeypatch, halting):
    # Q-heads that start out halting, held back half the time by exploration: samples leave at different
    # steps, so every checkpoint has samples in the middle of their supervision steps.
    monkeypatch.setattr("latentloop.models.reasoners.heads._INITIAL_BIAS", 5.0)
    run = dict(replace_halted=True, halt_exploration=0.5, steps=4, model={"n_sup": 3, "halting": halting})
    whole = train(config(**run), tmp_path / "whole")
    first = train(config(**run), tmp_path / "split", stop_at=2)
    slots = load_file(str(first.checkpoint / SLOTS_FILE))
    assert len(set(slots["0.steps"].tolist())) > 1, "samples in flight at different steps"
    second = train(config(**run), tmp_path / "split")
    assert second.resumed_from == 2
    assert first.losses + second.losses == whole.losses
    # Samples that halt after fewer than n_sup steps make room for more samples than fixed batches see.
    assert whole.counts["examples_seen"] > 4 * 8


def test_halted_samples_are_replaced_and_the_others_keep_their_carry():
    task = get_task("nqueens", n=5)
    puzzle = task.parse("Q" + "." * 24)
    split = {
        "inputs": task.encode(puzzle)[None],
        "labels": task.encode(task.solutions(puzzle)[0])[None],
        "puzzle_ids": np.zeros(1, dtype=np.int64),
    }
    run = config("trm", model={"n_sup": 4}, halt_exploration=0.0)
    torch.manual_seed(0)
    model = build_reasoner("trm", fit_to_task(run.model, task)).train()
    slots = HaltedReplacement(model, task, split, run.train, dist.SINGLE, "cpu")
    batch, _, carry, last = slots.next(0, 0)
    assert slots.take_loaded() == 8 and not last.any()
    carry, out = model(carry, batch)
    carry = {k: v.detach() for k, v in carry.items()}
    out.halt_logit = torch.where(torch.arange(8) < 3, 10.0, -10.0)  # the Q-head halts the first three
    finished = slots.advance(carry, out, last)
    assert finished["finished"] == 3 and finished["finished_steps"] == 3
    _, _, carry, last = slots.next(0, 1)
    assert slots.take_loaded() == 3 and slots.steps.tolist() == [0] * 3 + [1] * 5
    initial = model.initial_carry(batch)
    for key, value in carry.items():
        assert torch.equal(value[:3], initial[key][:3]), "fresh samples start from the initial carry"
        assert not torch.equal(value[3:], initial[key][3:]), "the others keep theirs"
    # Nothing halts now: the five older samples take their last (n_sup-th) step first and then leave.
    out.halt_logit = torch.full((8,), -10.0)
    slots.advance(carry, out, last)
    _, _, carry, last = slots.next(0, 2)
    assert not last.any()
    slots.advance(carry, out, last)
    _, _, carry, last = slots.next(0, 3)
    assert last.tolist() == [False] * 3 + [True] * 5
    finished = slots.advance(carry, out, last)
    assert finished["finished"] == 5 and finished["finished_steps"] == 5 * 4
    _, _, _, last = slots.next(1, 0)
    assert slots.take_loaded() == 5 and last.tolist() == [True] * 3 + [False] * 5


def test_compiled_training_follows_the_eager_run(tmp_path):
    """``train.compile`` changes kernels, not the run: same noise draws, losses equal up to float rounding,
    a checkpoint an eager model loads."""
    eager = train(config(steps=2, eval_size=0), tmp_path / "eager")
    counters.clear()
    run = config(steps=2, eval_size=0, compile=True)
    compiled = train(run, tmp_path / "compiled")
    blocks = sum(
        isinstance(m, Block) for m in build_reasoner("gram", run.model).modules()
    )  # fitted to the task
    assert 0 < counters["stats"]["unique_graphs"] <= blocks  # compiled, at most once per block
    assert compiled.step == 2
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-3)
    assert sorted(p.name for p in compiled.checkpoint.iterdir()) == sorted(
        p.name for p in eager.checkpoint.iterdir()
    )


def test_model_noise_is_a_pure_function_of_seed_step_and_rank():
    assert model_noise_seed(0, 5, 0) == model_noise_seed(0, 5, 0)
    # Ranks hold different rows of one batch: their noise must not repeat across ranks, steps or seeds.
    seeds = {model_noise_seed(seed, step, rank) for seed in (0, 1) for step in range(50) for rank in range(4)}
    assert len(seeds) == 2 * 50 * 4
    torch.manual_seed(model_noise_seed(0, 5, 0))
    rank0 = torch.randn(8)
    torch.manual_seed(model_noise_seed(0, 5, 1))
    assert not torch.equal(rank0, torch.randn(8))


def test_every_supervision_step_is_an_optimizer_step(tmp_path):
    result = train(config("trm", steps=1, eval_size=0), tmp_path / "run")
    state = torch.load(result.checkpoint / "optimizer.pt", weights_only=True)["optimizer"]["state"]
    assert {int(s["step"]) for s in state.values()} == {2}


def test_loss_falls_on_a_tiny_task(tmp_path):
    result = train(config("looped", steps=30, lr=1e-2, eval_size=0, batch_size=16), tmp_path / "run")
    early, late = sum(result.losses[:6]) / 6, sum(result.losses[-6:]) / 6
    assert late < early


def test_stablemax_is_a_distribution():
    logits = torch.tensor([[-3.0, 0.0, 2.5]])
    probs = stablemax_log_probs(logits).exp()
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)
    assert probs.argmax() == 2


def test_augmented_batches_stay_valid():
    from latentloop.tasks.base import get_task

    task = get_task("nqueens", n=5)
    split = {"inputs": task.encode(task.parse("Q" + "." * 24))[None], "labels": None, "puzzle_ids": [0]}
    solution = task.solutions(task.parse("Q" + "." * 24))[0]
    split["labels"] = task.encode(solution)[None]
    x, y, _ = train_batch(task, split, step=3, batch_size=16, seed=0, augment=True)
    for i in range(16):
        assert task.verify(task.decode(x[i].numpy()), task.decode(y[i].numpy()))
    assert len({bytes(r.numpy().astype("uint8")) for r in x}) > 1, "some boards were transformed"


def test_config_that_does_not_fit_the_task(tmp_path):
    bad = build_reasoner_config({**TINY, "model": {**TINY["model"], "seq_len": 16}}, arch="gram")
    with pytest.raises(UsageError, match="seq_len"):
        train(bad, tmp_path / "run")


def test_unknown_model_and_task():
    with pytest.raises(UsageError, match="unknown model"):
        build_reasoner_config(TINY, arch="nope")
    with pytest.raises(UsageError, match="unknown task"):
        build_reasoner_config(TINY, task="nope")


def test_ema_decay_warms_up_to_its_target():
    from latentloop.train.deep_supervision import ema_decay

    assert ema_decay(0.999, 0) == pytest.approx(0.1)  # the first update moves the average most of the way
    decays = [ema_decay(0.999, t) for t in range(20_000)]
    assert all(a <= b for a, b in itertools.pairwise(decays))
    assert decays[-1] == 0.999 and ema_decay(0.9, 1000) == 0.9


def test_arc_trains_a_puzzle_embedding_per_copy_and_scores_pass_at_2(tmp_path):
    from latentloop.data.dataset import load_dataset
    from latentloop.eval.reasoners import evaluate_reasoner
    from latentloop.infer.solve import solve_puzzle
    from latentloop.models.reasoners import load_reasoner
    from latentloop.tasks.base import get_task

    data = {
        "model": {**TINY["model"], "dim": 8, "hidden": 8, "puzzle_tokens": 2},
        "train": {
            **TINY["train"],
            "batch_size": 4,
            "steps": 2,
            "train_size": 2,
            "test_size": 2,
            "augment": False,
        },
        "task": {"name": "arc-agi-1", "augment": 1},
    }
    result = train(build_reasoner_config(data, arch="trm"), tmp_path / "run")
    dataset = load_dataset(tmp_path / "run" / "data")
    ids = {int(p) for split in ("train", "test") for p in dataset.split(split)["puzzle_ids"]}
    model = load_reasoner(result.checkpoint)
    assert model.config.puzzles == max(ids) + 1
    assert torch.count_nonzero(model.puzzle_embed.weight) > 0, "the embeddings of trained puzzles moved"
    report = evaluate_reasoner(tmp_path / "run", samples=2, steps=2, write=False)
    test_inputs = len({(t.id, i) for t in dataset_tasks(2) for i in range(len(t.test))})
    assert report["metric"] == "pass@2" and report["puzzles"] == test_inputs
    assert report["copies"] == 2 * test_inputs  # the original and one augmented copy of each
    assert 0.0 <= report["accuracy"] <= report["oracle_accuracy"] <= 1.0

    # `latentloop solve arc-agi-1 TASK --model RUN` answers the tasks the model has embeddings for.
    task = get_task("arc-agi-1")
    first, unseen = dataset_tasks(6)[0], dataset_tasks(6)[5]
    payload, text, _ = solve_puzzle(str(tmp_path / "run"), task, task.parse(first.id), samples=2)
    assert payload["copies"] == 2 and 1 <= len(payload["answers"]) <= 2 and "pass_at_2" in payload
    assert text.startswith("answer 1: ") and "pass@2" in text
    with pytest.raises(UsageError, match="no puzzle embedding"):
        solve_puzzle(str(tmp_path / "run"), task, task.parse(unseen.id))


def dataset_tasks(count):
    from latentloop.tasks.arc import load_arc

    return load_arc("arcagi")["test"][:count]


def test_ar_and_mdlm_refuse_a_task_that_needs_puzzle_embeddings(tmp_path):
    data = {
        **TINY,
        "task": {"name": "arc-agi-1"},
        "train": {**TINY["train"], "train_size": 1, "test_size": 1},
    }
    with pytest.raises(UsageError, match="puzzle embeddings"):
        train(build_reasoner_config(data, arch="mdlm"), tmp_path / "run")


def test_data_seed_keeps_the_puzzles_while_the_training_seed_changes(tmp_path):
    def data_files(run):
        return {str(p.relative_to(run)): p.read_bytes() for p in sorted((run / "data").rglob("*.npy"))}

    runs = {}
    for name, seeds in {"a": (0, None), "b": (1, 0), "c": (1, None)}.items():
        seed, data_seed = seeds
        runs[name] = train(config(seed=seed, data_seed=data_seed, eval_size=0), tmp_path / name)
    assert data_files(tmp_path / "a") == data_files(tmp_path / "b")  # the same train and test puzzles
    assert data_files(tmp_path / "b") != data_files(tmp_path / "c")  # train.seed alone draws another split
    assert runs["a"].losses != runs["b"].losses  # and the training itself follows its own seed


def test_nearest_target_teaches_a_prior_sample_the_completion_it_chose_and_leaves_the_others_their_label():
    task = get_task("nqueens", n=6)  # 4 solutions; a board with no queen given has them all as completions
    solutions = [task.encode(board).astype(np.int64) for board in task.solutions(np.zeros((6, 6), bool))]
    inputs = torch.full((3, 36), 1)
    labels = torch.from_numpy(np.stack([solutions[0]] * 3))
    labels[2, :4] = IGNORE_LABEL
    logits = torch.zeros(3, 36, 3).scatter_(
        -1, torch.from_numpy(solutions[2])[None, :, None].expand(3, 36, 1), 4.0
    )
    unguided = torch.tensor([True, False, True])
    taught = nearest_labels(task, inputs, labels, logits, unguided)
    assert torch.equal(taught[0], torch.from_numpy(solutions[2]))  # the answer it was heading for
    assert torch.equal(taught[1], labels[1])  # guided by the posterior: its own label
    assert torch.equal(taught[2, 4:], torch.from_numpy(solutions[2][4:]))
    assert (taught[2, :4] == IGNORE_LABEL).all()  # unscored cells stay unscored


@pytest.mark.parametrize(
    ("arch", "model", "task", "message"),
    [
        (
            "gram",
            {},
            TINY["task"],
            r"needs GRAM samples on the prior's noise \(model\.prior_share > 0 or model\.carry=prior\)",
        ),
        ("trm", {}, TINY["task"], "needs GRAM samples on the prior's noise"),
        ("gram", {"prior_share": 0.25}, {"name": "sudoku", "box": "2x2"}, "'sudoku' does not"),
    ],
)
def test_nearest_target_is_refused_where_it_means_nothing(tmp_path, arch, model, task, message):
    run = {
        **TINY,
        "task": task,
        "model": {**TINY["model"], **model},
        "train": {**TINY["train"], "nearest_target": True},
    }
    with pytest.raises(UsageError, match=message):
        train(build_reasoner_config(run, arch=arch), tmp_path / "run")
    assert not (tmp_path / "run" / "data").exists()  # refused before the dataset is built


def test_training_with_nearest_targets_takes_another_path_than_the_labels(tmp_path):
    """The prior-noise samples' labels are replaced inside the training step: the run trains, and its losses
    part from those of the same run on the drawn labels."""
    plain = train(config(model={"prior_share": 0.5}), tmp_path / "plain")
    nearest = train(config(model={"prior_share": 0.5}, nearest_target=True), tmp_path / "nearest")
    assert len(nearest.losses) == len(plain.losses) and all(math.isfinite(x) for x in nearest.losses)
    assert nearest.losses[0] != plain.losses[0]
