"""Checkpoint folders: atomic writes, retention, finding the newest, one-line errors on damage."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.train.checkpoint import (
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    resolve_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from latentloop.train.optim import build_optimizer


def _model_and_optimizer():
    torch.manual_seed(0)
    model = RecurrentDepthLM(RecurrentDepthConfig(n_embd=16, n_heads=2, intermediate_size=32, vocab_size=32))
    optimizer = build_optimizer(model, 1e-3)
    inputs = torch.randint(0, 32, (2, 6))
    model(inputs, num_steps=2, labels=inputs).loss.backward()
    optimizer.step()
    return model, optimizer


def test_save_writes_the_layout_and_keeps_the_last_n(tmp_path):
    model, optimizer = _model_and_optimizer()
    for step in (10, 20, 30):
        path = save_checkpoint(tmp_path, step, model, optimizer, {"tokens_seen": step * 4}, keep=2)
        assert path.name == f"step_{step:08d}"
        assert sorted(p.name for p in path.iterdir()) == [
            "README.md",  # the model card: a checkpoint folder is ready to push to the Hub
            "config.json",
            "model.safetensors",
            "optimizer.pt",
            "trainer_state.json",
        ]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000020", "step_00000030"]
    assert latest_checkpoint(tmp_path).name == "step_00000030"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    state = json.loads((latest_checkpoint(tmp_path) / "trainer_state.json").read_text())
    assert state["step"] == 30 and state["tokens_seen"] == 120
    # The model part is a huginn-layout folder that from_pretrained reads back exactly.
    loaded = RecurrentDepthLM.from_pretrained(latest_checkpoint(tmp_path))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


def test_incomplete_and_temporary_folders_are_not_checkpoints(tmp_path):
    model, optimizer = _model_and_optimizer()
    save_checkpoint(tmp_path, 5, model, optimizer, {}, keep=0)
    (tmp_path / "checkpoints" / ".tmp-step_00000009-1").mkdir()  # a crashed save
    partial = tmp_path / "checkpoints" / "step_00000007"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    assert latest_checkpoint(tmp_path).name == "step_00000005"
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_optimizer_and_rng_state_round_trip(tmp_path):
    model, optimizer = _model_and_optimizer()
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(6)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(6)
    path = save_checkpoint(tmp_path, 1, model, optimizer, {})
    torch.rand(10), random.random(), np.random.rand()  # move every generator on
    _, fresh = _model_and_optimizer()
    state, torch_rng = load_training_state(path, fresh)
    restore_rng_state(state["rng"], torch_rng)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]
    saved, loaded = optimizer.state_dict(), fresh.state_dict()
    for key, value in saved["state"].items():
        assert torch.equal(value["exp_avg"], loaded["state"][key]["exp_avg"])
    assert json.loads(json.dumps(capture_rng_state()))  # JSON-able


def test_damaged_checkpoints_raise_one_line_usage_errors(tmp_path):
    model, optimizer = _model_and_optimizer()
    path = save_checkpoint(tmp_path, 3, model, optimizer, {})
    data = (path / "optimizer.pt").read_bytes()
    (path / "optimizer.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match="corrupt") as info:
        load_training_state(path, optimizer)
    assert "\n" not in str(info.value)

    path = save_checkpoint(tmp_path, 4, model, optimizer, {})
    (path / "trainer_state.json").write_text('{"step": ')
    with pytest.raises(UsageError, match="corrupt"):
        load_training_state(path, optimizer)

    path = save_checkpoint(tmp_path, 5, model, optimizer, {})
    weights = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(weights[:100])
    with pytest.raises(UsageError) as info:
        RecurrentDepthLM.from_pretrained(path)
    assert "\n" not in str(info.value)


def test_resolve_checkpoint(tmp_path):
    model, optimizer = _model_and_optimizer()
    path = save_checkpoint(tmp_path, 2, model, optimizer, {})
    assert resolve_checkpoint(tmp_path) == path
    assert resolve_checkpoint(path) == path
    with pytest.raises(UsageError, match="does not exist"):
        resolve_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="neither"):
        resolve_checkpoint(tmp_path / "empty")
