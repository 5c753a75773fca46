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


# The deep-supervision trainer's tiny run: N-Queens 5x5, a few batches of a 16-wide model.
TINY_REASONER = {
    "model": {"dim": 16, "n_heads": 2, "n_layers": 1, "hidden": 32, "n_sup": 2, "cycles": 2, "inner": 2},
    "train": {
        "lr": 3e-3,
        "warmup_steps": 2,
        "batch_size": 8,
        "steps": 4,
        "precision": "fp32",
        "device": "cpu",
        "log_every": 1,
        "eval_size": 4,
        "checkpoint_every": 0,
        "tensorboard": False,
    },
    "task": {"name": "nqueens", "n": 5},
}


@pytest.fixture
def tiny_data() -> dict:
    """The tiny config as YAML-style data (a fresh copy per test)."""
    return copy.deepcopy(TINY)


@pytest.fixture
def tiny_config() -> RunConfig:
    return build_run_config(TINY)
