"""Shared fixtures: tiny models so the whole suite runs in minutes on two CPU cores."""

from __future__ import annotations

import pytest
import torch

from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM


def tiny_config(**overrides) -> RecurrentDepthConfig:
    base = dict(n_embd=64, n_heads=4, intermediate_size=128, vocab_size=96, block_size=128, mean_recurrence=4)
    base.update(overrides)
    return RecurrentDepthConfig(**base)


@pytest.fixture
def tiny_lm() -> RecurrentDepthLM:
    torch.manual_seed(0)
    return RecurrentDepthLM(tiny_config()).eval()
