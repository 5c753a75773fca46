"""Depth samplers: the distribution PAPERS.md reports, lockstep determinism, truncated backpropagation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.train.recurrence import DepthSampler, sampler_for


def test_poisson_lognormal_matches_the_paper_statistics():
    sampler = DepthSampler("poisson-lognormal", mean_recurrence=32, backprop_depth=8, seed=1)
    totals = np.array([sampler.total_depth(step) for step in range(20_000)])
    # PAPERS.md A: mean ~33, median ~29, 95th percentile ~67 for r̄=32.
    assert abs(totals.mean() - 33) < 0.8
    assert 27.5 <= np.median(totals) <= 30.5
    assert 60 <= np.percentile(totals, 95) <= 72
    assert totals.min() >= 1


def test_split_into_no_grad_then_grad_steps():
    sampler = DepthSampler("poisson-lognormal", mean_recurrence=32, backprop_depth=8, seed=0)
    for step in range(500):
        total = sampler.total_depth(step)
        no_grad, with_grad = sampler(step)
        assert no_grad + with_grad == total
        assert with_grad == min(8, total)
        assert no_grad == max(total - 8, 0)
    assert sampler.split(3) == (0, 3)
    assert sampler.split(8) == (0, 8)
    assert sampler.split(20) == (12, 8)


def test_same_seed_and_step_give_the_same_draw_on_every_rank():
    ranks = [DepthSampler("poisson-lognormal", 8, 4, seed=7) for _ in range(4)]  # one sampler per "rank"
    for step in (0, 1, 2, 99, 12345):
        assert len({sampler(step) for sampler in ranks}) == 1
    # Order of queries does not matter: the draw is a function of (seed, step), not a stream.
    forward = [ranks[0](s) for s in range(50)]
    backward = [ranks[1](s) for s in reversed(range(50))][::-1]
    assert forward == backward
    other_seed = DepthSampler("poisson-lognormal", 8, 4, seed=8)
    assert [other_seed(s) for s in range(50)] != forward


def test_fixed_and_uniform_schemes():
    fixed = DepthSampler("fixed", mean_recurrence=6, backprop_depth=2)
    assert {fixed(s) for s in range(20)} == {(4, 2)}
    uniform = DepthSampler("uniform", mean_recurrence=5, backprop_depth=3, seed=3)
    totals = np.array([uniform.total_depth(s) for s in range(5000)])
    assert totals.min() == 1 and totals.max() == 9  # 1 .. 2r̄-1
    assert abs(totals.mean() - 5) < 0.15


def test_bad_sampler_settings_are_usage_errors():
    with pytest.raises(UsageError, match="scheme"):
        DepthSampler("geometric")
    with pytest.raises(UsageError):
        DepthSampler(mean_recurrence=0)
    with pytest.raises(UsageError):
        DepthSampler(backprop_depth=-1)


def test_sampler_for_reads_the_model_config():
    config = RecurrentDepthConfig(mean_recurrence=5, mean_backprop_depth=2, sampling_scheme="fixed")
    assert sampler_for(config, seed=0)(0) == (3, 2)


def _tiny_model() -> RecurrentDepthLM:
    torch.manual_seed(0)
    config = RecurrentDepthConfig(
        n_embd=16, n_heads=2, intermediate_size=32, vocab_size=32, block_size=16, mean_backprop_depth=3
    )
    return RecurrentDepthLM(config).train()


def test_gradients_reach_only_the_last_k_core_iterations():
    model = _tiny_model()
    grad_flags: list[bool] = []
    model.transformer.core_block[0].register_forward_hook(
        lambda module, args, output: grad_flags.append(output.requires_grad)
    )
    sampler = DepthSampler("fixed", mean_recurrence=8, backprop_depth=3)
    no_grad, with_grad = sampler(0)
    inputs = torch.randint(0, 32, (2, 8))
    out = model(inputs, num_steps=(no_grad, with_grad), labels=inputs)
    assert grad_flags == [False] * 5 + [True] * 3
    out.loss.backward()
    assert model.transformer.adapter.weight.grad is not None
    assert model.transformer.adapter.weight.grad.abs().sum() > 0


def test_gradient_through_k_iterations_differs_from_one():
    """The gradient really depends on how many iterations are unrolled (so truncation is not a no-op)."""
    inputs = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    grads = []
    for split in ((5, 3), (7, 1)):
        model = _tiny_model()
        torch.manual_seed(2)
        model(inputs, num_steps=split, labels=inputs, init_scale=0.0).loss.backward()
        grads.append(model.transformer.adapter.weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])
