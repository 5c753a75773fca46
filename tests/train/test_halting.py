"""Halting: the simple BCE Q-head (default) and HRM's Q-learning variant, in training and in ``solve``."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from latentloop.errors import UsageError
from latentloop.infer.scaling import solve
from latentloop.models.reasoners import ReasonerConfig, TRMReasoner, build_reasoner
from latentloop.models.reasoners.heads import continue_target
from latentloop.train.deep_supervision import TRAIN_WEIGHTS, next_step_continue_target, supervision_loss
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_REASONER, tiny_run

TINY = tiny_run(TINY_REASONER, train={"eval_size": 0})


def run_config(arch: str, halting: str, **train):
    data = {
        "model": {**TINY["model"], "halting": halting},
        "train": {**TINY["train"], **train},
        "task": TINY["task"],
    }
    return build_reasoner_config(data, arch=arch)


def tiny_trm(halting: str, n_sup: int = 4) -> TRMReasoner:
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=4,
        seq_len=25,
        dim=16,
        n_heads=2,
        n_layers=1,
        hidden=32,
        n_sup=n_sup,
        cycles=2,
        inner=2,
        halting=halting,
    )
    return TRMReasoner(config).eval()


def test_continue_target_is_the_bootstrapped_formula():
    q_halt = torch.tensor([2.0, -1.0, 0.5, -3.0])
    q_continue = torch.tensor([1.0, 3.0, 0.5, -4.0])
    expected = [1 / (1 + math.exp(-v)) for v in (2.0, 3.0, 0.5, -3.0)]  # sigmoid(max(q_halt, q_continue))
    assert continue_target(q_halt, q_continue, last=False).tolist() == pytest.approx(expected)
    expected_last = [1 / (1 + math.exp(-v)) for v in (2.0, -1.0, 0.5, -3.0)]  # sigmoid(q_halt) only
    assert continue_target(q_halt, q_continue, last=True).tolist() == pytest.approx(expected_last)


def test_next_step_target_comes_from_a_no_grad_step_of_the_carry():
    model = tiny_trm("q-learning").train()
    with torch.no_grad():  # a head that is not constant, so the target depends on the state
        model.halt_head.proj.weight.normal_()
        model.halt_head.continue_proj.weight.normal_()
    batch = {"inputs": torch.randint(1, 4, (6, 25), generator=torch.Generator().manual_seed(1))}
    labels = batch["inputs"].clone()
    carry, _ = model(model.initial_carry(batch), batch, target=labels)
    target = next_step_continue_target(model, carry, batch, labels, last=False)
    assert not target.requires_grad
    _, ahead = model(carry, batch, target=labels)
    best = torch.maximum(ahead.halt_logit, ahead.continue_logit)
    torch.testing.assert_close(target, torch.sigmoid(best))
    torch.testing.assert_close(
        next_step_continue_target(model, carry, batch, labels, last=True), torch.sigmoid(ahead.halt_logit)
    )


def test_continue_loss_is_added_to_the_halting_loss():
    tc = run_config("trm", "q-learning").train
    labels = torch.tensor([[1, 2, 3], [2, 2, 1]])
    out = SimpleNamespace(
        logits=torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)),
        halt_logit=torch.tensor([0.3, -1.2]),
        continue_logit=torch.tensor([-0.4, 2.0]),
        value=torch.tensor([0.5, 0.5]),
        kl=torch.zeros(2),
        loss=None,
    )
    target = torch.tensor([0.9, 0.2])
    plain, plain_parts = supervision_loss(out, labels, 0.0, tc)
    with_q, q_parts = supervision_loss(out, labels, 0.0, tc, target)
    bce = F.binary_cross_entropy_with_logits(out.continue_logit, target)
    assert float(with_q - plain) == pytest.approx(tc.halt_weight * float(bce), rel=1e-5)
    assert q_parts["halt_loss"] == pytest.approx(plain_parts["halt_loss"] + float(bce), rel=1e-5)


def test_q_learning_run_trains_the_continue_head_and_resumes_exactly(tmp_path):
    whole = train(run_config("gram", "q-learning"), tmp_path / "whole")
    first = train(run_config("gram", "q-learning"), tmp_path / "split", stop_at=2)
    second = train(run_config("gram", "q-learning"), tmp_path / "split")
    assert second.resumed_from == 2
    assert all(math.isfinite(v) for v in whole.losses) and len(whole.losses) == 4 * 2
    assert first.losses + second.losses == whole.losses
    weights = load_file(str(whole.checkpoint / TRAIN_WEIGHTS))
    assert weights["halt_head.continue_proj.weight"].abs().sum() > 0, "q_continue got gradients"


def test_bce_run_leaves_the_continue_head_untouched(tmp_path):
    result = train(run_config("hrm", "bce", steps=1), tmp_path / "run")
    weights = load_file(str(result.checkpoint / TRAIN_WEIGHTS))
    assert torch.equal(weights["halt_head.continue_proj.weight"], torch.zeros(1, 16))
    assert torch.equal(weights["halt_head.continue_proj.bias"], torch.tensor([-5.0]))


def test_unknown_halting_is_a_usage_error():
    with pytest.raises(UsageError, match=r"model\.halting must be one of bce, q-learning"):
        run_config("trm", "sometimes")


def _first_stop(model: TRMReasoner, x: torch.Tensor, steps: int, rule) -> torch.Tensor:
    """The 1-based step at which each puzzle first meets ``rule(q_halt, q_continue)`` (``steps`` if never)."""
    batch = {"inputs": x}
    carry = model.initial_carry(batch)
    stopped = torch.full((x.shape[0],), steps)
    with torch.no_grad():
        for step in range(steps):
            carry, out = model(carry, batch)
            first = rule(out.halt_logit, out.continue_logit) & (stopped == steps)
            stopped[first] = step + 1
    return stopped


@pytest.mark.parametrize("halting", ["q-learning", "bce"])
def test_solve_halts_by_the_models_rule(halting):
    steps, samples = 4, 3
    model = tiny_trm(halting, n_sup=steps)
    x = torch.randint(1, 4, (9, 25), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.halt_head.proj.weight.normal_(generator=torch.Generator().manual_seed(3))
        q_halt = model(model.initial_carry({"inputs": x}), {"inputs": x})[1].halt_logit
        # Shift q_halt so that 0 falls between its 5th and 6th smallest value at step 1 (sigmoid > 0.5 for
        # 4 puzzles), and set q_continue, a constant, between the 2nd and 3rd (q_halt above it for 7): the
        # two rules then disagree on 3 puzzles at step 1.
        ordered = q_halt.sort().values
        middle = float(ordered[4] + ordered[5]) / 2
        model.halt_head.proj.bias -= middle
        model.halt_head.continue_proj.bias.fill_(float(ordered[1] + ordered[2]) / 2 - middle)
    q_rule = _first_stop(model, x, steps, lambda h, c: h > c)
    bce_rule = _first_stop(model, x, steps, lambda h, c: torch.sigmoid(h) > 0.5)
    assert int((q_rule == 1).sum()) == 7 and int((bce_rule == 1).sum()) == 4
    expected = q_rule if halting == "q-learning" else bce_rule
    free = solve(model, x, steps=steps, samples=samples)
    result = solve(model, x, steps=steps, samples=samples, halt=True)
    assert torch.equal(result.halted_at, expected.expand(samples, -1))
    # A halted sample keeps the answer and value of its halting step; the others follow the model's steps.
    for puzzle, stop in enumerate(expected.tolist()):
        for step in range(steps):
            kept = min(step, stop - 1)
            assert torch.equal(result.predictions[step, :, puzzle], free.predictions[kept, :, puzzle])
            assert torch.equal(result.values[step, :, puzzle], free.values[kept, :, puzzle])
    # Without halting, some answers that halting keeps would have changed later: the freeze is visible.
    would_change = [
        puzzle
        for puzzle, stop in enumerate(expected.tolist())
        if not torch.equal(free.predictions[stop - 1, 0, puzzle], free.predictions[-1, 0, puzzle])
    ]
    assert would_change
    assert not torch.equal(result.predictions, free.predictions)


def test_weights_saved_without_a_continue_head_still_load(tmp_path):
    model = build_reasoner("trm", tiny_trm("bce").config)
    state = {k: v for k, v in model.state_dict().items() if "continue_proj" not in k}
    fresh = build_reasoner("trm", tiny_trm("bce").config)
    with torch.no_grad():
        fresh.halt_head.continue_proj.bias.fill_(1.0)
    fresh.load_state_dict(state)  # strict: every other key must still be there
    assert torch.equal(fresh.halt_head.continue_proj.bias, torch.tensor([1.0]))
    torch.testing.assert_close(fresh.halt_head.proj.weight, model.halt_head.proj.weight)
    del state["halt_head.proj.bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh.load_state_dict(state)
