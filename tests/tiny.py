"""Tiny run configs shared by the tests: a few seconds per run on two CPU cores.

Tests take a variant with ``tiny_run(BASE, section={...})`` rather than writing a config of their own, so a
change to what "tiny" means happens in one place.
"""

from __future__ import annotations

import copy
from typing import Any

# The recurrent-depth LM on 2-digit arithmetic.
TINY_LM: dict[str, Any] = {
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

# A deep-supervision reasoner on N-Queens 5x5: a few batches of a 16-wide model.
TINY_REASONER: dict[str, Any] = {
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

# The one-pass generative baselines (AR, MDLM): one supervision step, long enough for the loss to fall.
TINY_GENERATIVE: dict[str, Any] = {
    **TINY_REASONER,
    "model": {**TINY_REASONER["model"], "n_sup": 1},
    "train": {
        **TINY_REASONER["train"],
        "lr": 1e-2,
        "batch_size": 16,
        "steps": 30,
        "halt_weight": 0.0,
        "value_weight": 0.0,
    },
}


def tiny_run(base: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A fresh copy of ``base`` with each section's keys updated (``train={"steps": 2}``); a section given as a
    non-dict (``arch="trm"``) is set as it is."""
    run = copy.deepcopy(base)
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(run.get(name), dict):
            run[name].update(copy.deepcopy(value))
        else:
            run[name] = copy.deepcopy(value)
    return run
