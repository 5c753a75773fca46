"""The matmul FLOPs counted from shapes: linear layers and attention by their exact value, passes without
gradient apart from those with it."""

from __future__ import annotations

import torch
from torch import nn

from latentloop.nn import Attention
from latentloop.nn.flops import FlopCounter


def test_a_linear_layer_costs_two_flops_per_multiply_add():
    layer = nn.Linear(8, 3)
    with FlopCounter(layer) as count:
        layer(torch.zeros(5, 4, 8))
    assert count.with_grad == 2 * 5 * 4 * 8 * 3 and count.without_grad == 0
    assert count.training_flops == 3 * count.with_grad


def test_attention_counts_its_projections_and_both_products():
    attention = Attention(16, n_heads=4)
    with FlopCounter(attention) as count:
        attention(torch.zeros(2, 10, 16), causal=False)
    projections = 2 * 2 * 10 * 16 * (3 * 16 + 16)
    products = 2 * (2 * 2 * 10 * 10 * 16)  # QK^T and PV, each 2 * B * L * L * dim
    assert count.forward_flops == projections + products


def test_passes_without_gradient_cost_their_forward_only():
    layer = nn.Linear(4, 4)
    with FlopCounter(layer) as count:
        layer(torch.zeros(1, 4))
        with torch.no_grad():
            layer(torch.zeros(3, 4))
    assert (count.with_grad, count.without_grad) == (32, 96)
    assert count.training_flops == 3 * 32 + 96


def test_hooks_are_removed_on_exit():
    layer = nn.Linear(4, 4)
    with FlopCounter(layer) as count:
        pass
    layer(torch.zeros(1, 4))
    assert count.forward_flops == 0 and not layer._forward_hooks
