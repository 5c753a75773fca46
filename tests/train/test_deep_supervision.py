"""Deep-supervision training: exact resume, the losses, the optimizer steps per supervision step."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from latentloop.errors import UsageError
from latentloop.train.deep_supervision import (
    build_reasoner_config,
    model_noise_seed,
    stablemax_log_probs,
    train_batch,
    train_reasoner,
)
from tests.train.conftest import TINY_REASONER

TINY = TINY_REASONER


def config(arch="gram", **train):
    data = {**TINY, "train": {**TINY["train"], **train}}
    return build_reasoner_config(data, arch=arch)


def test_resumed_training_continues_exactly(tmp_path):
    whole = train_reasoner(config(), tmp_path / "whole")
    first = train_reasoner(config(), tmp_path / "split", stop_at=2)
    assert first.stopped == "stop_at" and first.step == 2
    second = train_reasoner(config(), tmp_path / "split")
    assert second.resumed_from == 2
    assert len(whole.losses) == 4 * 2  # one loss per supervision step (n_sup = 2 per batch)
    assert first.losses + second.losses == whole.losses


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
    result = train_reasoner(config("trm", steps=1, eval_size=0), tmp_path / "run")
    state = torch.load(result.checkpoint / "optimizer.pt", weights_only=True)["optimizer"]["state"]
    assert {int(s["step"]) for s in state.values()} == {2}


def test_loss_falls_on_a_tiny_task(tmp_path):
    result = train_reasoner(config("looped", steps=30, lr=1e-2, eval_size=0, batch_size=16), tmp_path / "run")
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
    split = {"inputs": task.encode(task.parse("Q" + "." * 24))[None], "labels": None}
    solution = task.solutions(task.parse("Q" + "." * 24))[0]
    split["labels"] = task.encode(solution)[None]
    x, y = train_batch(task, split, step=3, batch_size=16, seed=0, augment=True)
    for i in range(16):
        assert task.verify(task.decode(x[i].numpy()), task.decode(y[i].numpy()))
    assert len({bytes(r.numpy().astype("uint8")) for r in x}) > 1, "some boards were transformed"


def test_config_that_does_not_fit_the_task(tmp_path):
    bad = build_reasoner_config({**TINY, "model": {**TINY["model"], "seq_len": 16}}, arch="gram")
    with pytest.raises(UsageError, match="seq_len"):
        train_reasoner(bad, tmp_path / "run")


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
