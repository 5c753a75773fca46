"""Learning-rate schedule and parameter groups."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.train.optim import build_optimizer, lr_at, parameter_groups


def test_warmup_then_cosine_to_the_floor():
    lrs = [lr_at(s, 1.0, warmup_steps=10, total_steps=110, min_lr_ratio=0.1) for s in range(130)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(lrs[:10]))  # linear rise
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:111]))  # monotone decay
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[110] == pytest.approx(0.1) and lrs[129] == pytest.approx(0.1)


def test_warmup_stable_decay_holds_the_rate_then_decays_over_the_last_share():
    lrs = [lr_at(s, 1.0, 10, 110, 0.1, decay_fraction=0.2) for s in range(120)]
    assert lrs[9] == pytest.approx(1.0) and set(lrs[10:89]) == {1.0}  # held until 110 - 22 = 88
    assert lrs[99] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert all(a >= b for a, b in itertools.pairwise(lrs[88:111]))
    assert lrs[110] == pytest.approx(0.1) and lrs[119] == pytest.approx(0.1)
    # The whole run decays when the fraction is 1, as the plain cosine does.
    assert [lr_at(s, 1.0, 10, 110, 0.1, 1.0) for s in range(120)] == [
        lr_at(s, 1.0, 10, 110, 0.1) for s in range(120)
    ]


def test_no_weight_decay_on_norms_biases_qk_bias_and_embeddings():
    model = RecurrentDepthLM(RecurrentDepthConfig(n_embd=16, n_heads=2, intermediate_size=32, vocab_size=32))
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    free = {names[id(p)] for p in no_decay["params"]}
    assert "transformer.wte.weight" in free
    assert any(n.endswith("qk_bias") for n in free)
    assert any(n.endswith("norm_1.weight") for n in free) and "transformer.ln_f.weight" in free
    assert all(n.endswith(("Wqkv.weight", "proj.weight", "fc.weight", "adapter.weight")) for n in decayed)
    total = sum(p.numel() for p in decay["params"] + no_decay["params"])
    assert total == model.num_parameters()  # tied head counted once, nothing missing
    optimizer = build_optimizer(model, 1e-3, (0.9, 0.95), 0.1)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)
