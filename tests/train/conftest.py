"""Tiny run configs shared by the training tests (a few seconds per run on 2 CPU cores)."""

from __future__ import annotations

import copy

import pytest

from latentloop.train.trainer import RunConfig, build_run_config

TINY = {
    "model": {
        "n_embd": 32,
        "n_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 264,
        "block_size": 32,
        "mean_recurrence": 3,
        "mean_backprop_depth": 2,
    },
    "train": {
        "lr": 3e-3,
        "warmup_steps": 2,
        "batch_size": 8,
        "steps": 6,
        "precision": "fp32",
        "device": "cpu",
        "log_every": 1,
        "eval_every": 0,
        "eval_size": 16,
        "checkpoint_every": 0,
        "tensorboard": False,
    },
    "task": {"name": "arithmetic", "digits": 2, "test_size": 32},
}


@pytest.fixture
def tiny_data() -> dict:
    """The tiny config as YAML-style data (a fresh copy per test)."""
    return copy.deepcopy(TINY)


@pytest.fixture
def tiny_config() -> RunConfig:
    return build_run_config(TINY)
