"""Quantized folders: what save_quantized writes loads back as the same model (the same logits, tied weights
still tied) for both families, and a damaged folder is a one-line error."""

from __future__ import annotations

import json

import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.generation import generate, quantized_copy
from latentloop.models.looped_lms import QUANTIZATION_FILE, load_looped_lm, save_quantized
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.nn.quantized import Int8Linear, is_quantized, quantize_weights
from tests.conftest import tiny_config
from tests.models.test_ouro import tiny as tiny_ouro


def huginn() -> RecurrentDepthLM:
    torch.manual_seed(0)
    return RecurrentDepthLM(tiny_config()).eval()


@pytest.mark.parametrize("family", [huginn, tiny_ouro])
def test_a_quantized_folder_loads_as_the_same_model(family, tmp_path):
    quantized = quantize_weights(family()).eval()
    save_quantized(quantized, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "model.safetensors",
        QUANTIZATION_FILE,
    ]
    loaded = load_looped_lm(tmp_path)
    assert type(loaded) is type(quantized) and is_quantized(loaded)
    prompt = torch.randint(0, 60, (2, 7))
    want = generate(quantized, prompt, max_new_tokens=6, num_steps=3, init_scale=0, return_logits=True)
    got = generate(loaded, prompt, max_new_tokens=6, num_steps=3, init_scale=0, return_logits=True)
    assert torch.equal(got.sequences, want.sequences) and torch.equal(got.logits, want.logits)


def test_a_tied_output_layer_is_stored_once_and_stays_tied(tmp_path):
    save_quantized(quantize_weights(huginn()), tmp_path)
    shared = json.loads((tmp_path / QUANTIZATION_FILE).read_text())["shared"]
    assert shared == {"lm_head.weight": "transformer.wte.weight", "lm_head.scale": "transformer.wte.scale"}
    loaded = load_looped_lm(tmp_path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight


def test_weights_quantize_a_float_checkpoint_as_it_loads(tmp_path):
    model = huginn()
    model.save_pretrained(tmp_path)
    loaded = load_looped_lm(tmp_path, weights="int8")
    assert isinstance(loaded.lm_head, Int8Linear)
    assert torch.equal(loaded.lm_head.weight, quantize_weights(model).lm_head.weight)
    with pytest.raises(UsageError, match="weights must be one of int8"):
        load_looped_lm(tmp_path, weights="int3")


def test_a_damaged_quantized_folder_is_a_one_line_error(tmp_path):
    save_quantized(quantize_weights(huginn()), tmp_path)
    spec = json.loads((tmp_path / QUANTIZATION_FILE).read_text())
    (tmp_path / QUANTIZATION_FILE).write_text(json.dumps({**spec, "weights": "int4"}))
    with pytest.raises(UsageError, match="weights must be one of int8"):
        load_looped_lm(tmp_path)
    (tmp_path / QUANTIZATION_FILE).write_text(json.dumps({**spec, "shared": {}}))
    with pytest.raises(UsageError, match=r"missing key 'lm_head\.scale'"):
        load_looped_lm(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / QUANTIZATION_FILE).write_text(json.dumps(spec))
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_embd": 32}))
    with pytest.raises(UsageError, match="has shape"):
        load_looped_lm(tmp_path)
    with pytest.raises(UsageError, match="quantize_weights"):
        save_quantized(huginn(), tmp_path)


def test_generate_keeps_one_quantized_copy_until_the_weights_change():
    model = huginn()
    prompt = torch.randint(0, 60, (1, 5))
    first = quantized_copy(model, "int8")
    assert quantized_copy(model, "int8") is first and quantized_copy(first, "int8") is first
    want = generate(first, prompt, max_new_tokens=5, num_steps=2, init_scale=0).sequences
    assert torch.equal(
        generate(model, prompt, max_new_tokens=5, num_steps=2, init_scale=0, weights="int8").sequences, want
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # a training step
    again = quantized_copy(model, "int8")
    assert again is not first and torch.equal(again.lm_head.scale, 2 * first.lm_head.scale)
