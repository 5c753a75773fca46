"""Packed linear layers (latentloop.nn.packed): the copy shares the model's parameters, computes what
``F.linear`` computes, leaves the model as it was, and refuses what oneDNN cannot pack; ``generate`` with
``prepack=True`` gives the tokens of plain decoding on both looped-LM families, batched and left-padded."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.models.generation import generate
from latentloop.models.ouro import OuroLM
from latentloop.nn.packed import PackedLinear, prepacked
from tests.models.test_ouro import tiny

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")


def tiny_ouro() -> OuroLM:
    return tiny(tie_word_embeddings=True)  # a tied head: packed once, the embedding kept as it is


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_computes_f_linear_on_any_rows(bias):
    torch.manual_seed(0)
    linear = nn.Linear(24, 40, bias=bias)
    packed = PackedLinear(linear, rows=8)
    for shape in ((1, 24), (8, 24), (3, 5, 24)):
        x = torch.randn(shape)
        out = packed(x)
        assert out.shape == (*shape[:-1], 40)
        torch.testing.assert_close(out, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


def test_the_copy_shares_every_parameter_and_leaves_the_model_unchanged():
    model = tiny_ouro()
    copy = prepacked(model, rows=2)
    originals = {id(p) for p in model.parameters()}
    assert {id(p) for p in copy.parameters()} <= originals  # nothing copied (the weights live in the packs)
    assert all(not isinstance(m, PackedLinear) for m in model.modules())
    packs = [m for m in copy.modules() if isinstance(m, PackedLinear)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(packs) == len(linears) and not any(isinstance(m, nn.Linear) for m in copy.modules())
    # the tied head shares its weight with the embedding in the model; the copy's embedding is the same tensor
    assert copy.model.embed_tokens.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 64, (2, 6))
    torch.testing.assert_close(copy(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_prepacked_decoding_gives_the_plain_tokens_on_both_families(tiny_lm):
    ouro = tiny_ouro()
    ids = torch.randint(1, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    for model, steps in ((ouro, 4), (tiny_lm, 6)):
        options = dict(max_new_tokens=8, num_steps=steps, init_scale=0.0, attention_mask=mask)
        plain = generate(model, ids, **options).sequences
        assert torch.equal(generate(model, ids, prepack=True, **options).sequences, plain)
    assert all(not isinstance(m, PackedLinear) for m in tiny_lm.modules())


def test_prepack_in_latent_width_and_on_the_command_line(tiny_lm, tmp_path, capsys):
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    runs = []
    for prepack in (False, True):
        torch.manual_seed(3)  # the same random initial states
        out = generate(tiny_lm, ids, max_new_tokens=6, num_steps=4, num_samples=3, prepack=prepack)
        runs.append((out.sequences, out.samples))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    torch.manual_seed(0)
    big = OuroLM(dataclasses.replace(tiny_ouro().config, vocab_size=260)).eval()  # the byte tokenizer's ids
    big.save_pretrained(tmp_path / "m")
    tokens = []
    for flags in ([], ["--prepack"]):
        assert main(["generate", str(tmp_path / "m"), "ab", "-n", "5", "--json", *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        tokens.append(report["tokens"])
        assert report["prepack"] == bool(flags)
    assert tokens[0] == tokens[1]


def test_prepack_refuses_what_it_cannot_pack():
    with pytest.raises(UsageError, match="prepack and compile"):
        generate(tiny_ouro(), torch.ones(1, 3, dtype=torch.long), prepack=True, compile=True)
    with pytest.raises(UsageError, match="fp32 or bf16"):
        generate(tiny_ouro().double(), torch.ones(1, 3, dtype=torch.long), prepack=True)
    bf16 = tiny_ouro().to(torch.bfloat16)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert generate(bf16, torch.ones(1, 3, dtype=torch.long), prepack=True).sequences.shape == (1, 35)
    else:
        with pytest.raises(UsageError, match="no oneDNN bf16 kernels"):
            generate(bf16, torch.ones(1, 3, dtype=torch.long), prepack=True)
