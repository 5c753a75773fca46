"""Test-time compute: the FLOPs of a (steps, samples) setting counted from shapes, and the noisy deterministic
model (state noise, selection by the halting head)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from latentloop.errors import UsageError
from latentloop.infer.scaling import StepCost, inference_flops, select_sample, solve, step_cost
from latentloop.models.reasoners import ReasonerConfig, build_reasoner

L, D, H, V = 12, 16, 24, 5  # positions, width, MLP width, vocabulary
CYCLES, INNER, LAYERS = 2, 3, 2


def _trm() -> torch.nn.Module:
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=V,
        seq_len=L,
        dim=D,
        n_heads=2,
        n_layers=LAYERS,
        hidden=H,
        n_sup=4,
        cycles=CYCLES,
        inner=INNER,
    )
    return build_reasoner("trm", config).eval()


def test_a_step_costs_every_matrix_product_of_the_recursion_decoder_and_heads():
    cost = step_cost(_trm())
    # A post-norm attention block on one puzzle: QKV and output projections, QK^T and PV, the gated MLP.
    block = 2 * L * D * 3 * D + 2 * L * D * D + 4 * L * L * D + 2 * L * D * 2 * H + 2 * L * H * D
    recursion = CYCLES * (INNER + 1) * LAYERS * block  # T latent recursions of n + 1 network passes
    decoder, halting, value = 2 * L * D * V, 2 * D * 2, 2 * D
    assert cost == StepCost(step=recursion + decoder + halting, value_head=value)


def test_the_step_count_matches_torch_flop_counter():
    model = _trm()
    batch = {"inputs": torch.ones(1, L, dtype=torch.long)}
    # The math kernel of attention runs as matrix products that FlopCounterMode counts.
    with torch.no_grad(), FlopCounterMode(display=False) as reference, sdpa_kernel(SDPBackend.MATH):
        model(model.initial_carry(batch), batch)
    cost = step_cost(model)
    assert cost.step + cost.value_head == reference.get_total_flops()


def test_inference_flops_multiply_the_step_by_steps_and_trajectories_and_add_the_value_head_to_select():
    cost = StepCost(step=1000, value_head=7)
    assert inference_flops(cost, steps=16, runs=20, select="vote") == 320_000
    assert inference_flops(cost, steps=16, runs=20, select="q") == 320_000
    assert inference_flops(cost, steps=16, runs=20, select="value") == 320_000 + 140
    assert inference_flops(cost, steps=320, runs=1, select="first") == 320_000
    with pytest.raises(UsageError):
        inference_flops(cost, 1, 1, "best")


def test_counting_draws_none_of_the_callers_noise():
    model = build_reasoner("gram", ReasonerConfig(vocab_size=V, seq_len=L, dim=D, n_heads=2, n_layers=1))
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    step_cost(model)  # GRAM's step draws its prior noise
    assert torch.equal(torch.rand(3), expected)


def test_q_selects_the_highest_halting_logit():
    assert select_sample(["a", "a", "b"], [-1.0, 2.0, 0.5], "q") == 1
    assert select_sample(["a", "b"], [0.3, 0.3], "q") == 0  # ties go to the first


def test_state_noise_makes_a_deterministic_models_samples_differ_and_q_picks_by_the_halting_head():
    model = _trm()
    torch.nn.init.normal_(model.halt_head.proj.weight, std=1.0)  # halting logits that differ between samples
    x = torch.randint(1, V, (3, L))
    plain = solve(model, x, steps=2, samples=4, select="q")
    assert torch.equal(plain.halt_logits[:, 0], plain.halt_logits[:, 3]), "without noise every sample agrees"
    torch.manual_seed(0)
    noisy = solve(model, x, steps=2, samples=4, select="q", state_noise=0.5)
    # An untrained decoder gives every sample the same tokens; the latent trajectories part all the same.
    assert not torch.equal(noisy.halt_logits[:, 0], noisy.halt_logits[:, 1])
    assert not torch.equal(noisy.values[:, 0], noisy.values[:, 1])
    last = noisy.halt_logits[-1]  # [K, B]
    assert torch.equal(noisy.chosen_sample, last.argmax(0))
    assert bool((noisy.chosen_sample != 0).any()), "the test needs a puzzle where q does not pick sample 0"
    assert torch.equal(noisy.chosen, noisy.predictions[-1, last.argmax(0), torch.arange(3)])
    with pytest.raises(UsageError, match="state-noise"):
        solve(model, x, state_noise=-0.1)


def test_state_noise_solves_a_model_whose_carry_holds_integer_bookkeeping():
    """GRAM with target_reveal carries each cell's reveal step beside its latent states; noise on the states must
    leave those integers alone rather than fail on them."""
    config = ReasonerConfig(
        vocab_size=V, seq_len=L, dim=16, n_heads=2, n_layers=1, hidden=32, n_sup=2, cycles=1, target_reveal=2
    )
    model = build_reasoner("gram", config).eval()
    x = torch.randint(1, V, (3, L))
    torch.manual_seed(0)
    result = solve(model, x, steps=2, samples=2, state_noise=0.5)
    assert result.predictions.shape[:3] == (2, 2, 3)
