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
from latentloop.train.deep_supervision import (
    TRAIN_WEIGHTS,
    build_reasoner_config,
    next_step_continue_target,
    supervision_loss,
    train_reasoner,
)
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
    )
    target = torch.tensor([0.9, 0.2])
    plain, plain_parts = supervision_loss(out, labels, 0.0, tc)
    with_q, q_parts = supervision_loss(out, labels, 0.0, tc, target)
    bce = F.binary_cross_entropy_with_logits(out.continue_logit, target)
    assert float(with_q - plain) == pytest.approx(tc.halt_weight * float(bce), rel=1e-5)
    assert q_parts["halt_loss"] == pytest.approx(plain_parts["halt_loss"] + float(bce), rel=1e-5)


def test_q_learning_run_trains_the_continue_head_and_resumes_exactly(tmp_path):
    whole = train_reasoner(run_config("gram", "q-learning"), tmp_path / "whole")
    first = train_reasoner(run_config("gram", "q-learning"), tmp_path / "split", stop_at=2)
    second = train_reasoner(run_config("gram", "q-learning"), tmp_path / "split")
    assert second.resumed_from == 2
    assert all(math.isfinite(v) for v in whole.losses) and len(whole.losses) == 4 * 2
    assert first.losses + second.losses == whole.losses
    weights = load_file(str(whole.checkpoint / TRAIN_WEIGHTS))
    assert weights["halt_head.continue_proj.weight"].abs().sum() > 0, "q_continue got gradients"


def test_bce_run_leaves_the_continue_head_untouched(tmp_path):
    result = train_reasoner(run_config("hrm", "bce", steps=1), tmp_path / "run")
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
        # Every q_halt of step 1 below 0 (sigmoid < 0.5), and q_continue a constant between them: the two
        # rules then disagree on about half of the puzzles at step 1.
        model.halt_head.proj.bias -= float(q_halt.max()) + 0.1
        model.halt_head.continue_proj.bias.fill_(float(q_halt.median() - q_halt.max() - 0.1))
    q_rule = _first_stop(model, x, steps, lambda h, c: h > c)
    bce_rule = _first_stop(model, x, steps, lambda h, c: torch.sigmoid(h) > 0.5)
    assert (q_rule == 1).any() and (q_rule > 1).any() and not (bce_rule == 1).any()
    expected = q_rule if halting == "q-learning" else bce_rule
    result = solve(model, x, steps=steps, samples=samples, halt=True)
    assert torch.equal(result.halted_at, expected.expand(samples, -1))
    # A halted sample keeps the answer of its halting step.
    halted = int(torch.nonzero(expected == 1)[0]) if (expected == 1).any() else None
    if halted is not None:
        assert torch.equal(result.predictions[-1, 0, halted], result.predictions[0, 0, halted])


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
