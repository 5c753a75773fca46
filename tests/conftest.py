"""Shared fixtures: tiny models so the whole suite runs in minutes on two CPU cores."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from tests.tiny import TINY_REASONER, tiny_run

# The suite never reaches the network: a Hub model id (org/name) is looked up in the local cache only.
# huggingface_hub reads the variable once, when imported (latentloop imports it only when a Hub id is used);
# child processes inherit it.
os.environ["HF_HUB_OFFLINE"] = "1"
if "huggingface_hub" in sys.modules:
    importlib.import_module("huggingface_hub.constants").HF_HUB_OFFLINE = True


def tiny_config(**overrides) -> RecurrentDepthConfig:
    base = dict(n_embd=64, n_heads=4, intermediate_size=128, vocab_size=96, block_size=128, mean_recurrence=4)
    base.update(overrides)
    return RecurrentDepthConfig(**base)


@pytest.fixture
def tiny_lm() -> RecurrentDepthLM:
    torch.manual_seed(0)
    return RecurrentDepthLM(tiny_config()).eval()


@pytest.fixture(scope="module")
def gram_run(tmp_path_factory):
    """A GRAM run trained for two batches on N-Queens 5x5 (one per test module)."""
    from latentloop.train.loop import train
    from latentloop.train.run_config import build_reasoner_config

    run = tmp_path_factory.mktemp("gram") / "run"
    data = tiny_run(
        TINY_REASONER, arch="gram", model={"cycles": 1, "inner": 1}, train={"steps": 2, "eval_size": 0}
    )
    train(build_reasoner_config(data), run)
    return run
