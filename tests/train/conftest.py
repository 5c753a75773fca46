"""The tiny LM run config as fixtures for the training tests."""

from __future__ import annotations

import copy

import pytest

from latentloop.train.run_config import RunConfig, build_run_config
from tests.tiny import TINY_LM


@pytest.fixture
def tiny_data() -> dict:
    """The tiny config as YAML-style data (a fresh copy per test)."""
    return copy.deepcopy(TINY_LM)


@pytest.fixture
def tiny_config() -> RunConfig:
    return build_run_config(TINY_LM)
