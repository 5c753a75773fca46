import json
import math

import pytest
import torch
from safetensors.torch import save_file

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from tests.conftest import tiny_config

HUGINN_BIG = dict(
    n_embd=5280,
    n_heads=55,
    n_layers_in_prelude=2,
    n_layers_in_recurrent_block=4,
    n_layers_in_coda=2,
    intermediate_size=17920,
    vocab_size=65536,
    block_size=4096,
    mean_recurrence=32,
    mean_backprop_depth=8,
)


def reference_forward(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor, r: int) -> torch.Tensor:
    """An independent functional transcription of PAPERS.md A, reading huginn-0125 key names directly."""
    h, heads = cfg["n_embd"], cfg["n_heads"]
    hd = h // heads
    eps = cfg["norm_eps"]
    T = ids.shape[1]

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

    inv = 1.0 / (cfg["rope_base"] ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(T).float(), inv)
    rot = torch.polar(torch.ones_like(ang), ang)[None, :, None, :]

    def rope(x):
        return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous()) * rot).flatten(
            -2
        )

    def layer(x, p):
        y = rms(x, p + "norm_1.weight")
        q, k, v = (y @ w[p + "attn.Wqkv.weight"].T).split(h, dim=-1)
        q = q.view(1, T, heads, hd) + w[p + "attn.qk_bias"][0]
        k = k.view(1, T, heads, hd) + w[p + "attn.qk_bias"][1]
        q, k, v = rope(q).transpose(1, 2), rope(k).transpose(1, 2), v.view(1, T, heads, hd).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, T, h) @ w[p + "attn.proj.weight"].T
        x = rms(x + a, p + "norm_2.weight")
        gate, up = (rms(x, p + "norm_3.weight") @ w[p + "mlp.fc.weight"].T).chunk(2, -1)
        m = (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.proj.weight"].T
        return rms(x + m, p + "norm_4.weight")

    e = w["transformer.wte.weight"][ids] * math.sqrt(h)
    for i in range(cfg["n_layers_in_prelude"]):
        e = layer(e, f"transformer.prelude.{i}.")
    s = torch.zeros_like(e)
    for _ in range(r):
        s = torch.cat([s, e], -1) @ w["transformer.adapter.weight"].T
        for i in range(cfg["n_layers_in_recurrent_block"]):
            s = layer(s, f"transformer.core_block.{i}.")
    x = rms(s, "transformer.ln_f.weight")
    for i in range(cfg["n_layers_in_coda"]):
        x = layer(x, f"transformer.coda.{i}.")
    return rms(x, "transformer.ln_f.weight") @ w["transformer.wte.weight"].T


def random_huginn_checkpoint(folder, cfg: dict, with_freqs: bool, with_head: bool) -> dict[str, torch.Tensor]:
    """Write random weights under huginn-0125 names, sharded in two files with an index."""
    g = torch.Generator().manual_seed(1)
    h, inter = cfg["n_embd"], cfg["intermediate_size"]
    hd = h // cfg["n_heads"]
    w = {"transformer.wte.weight": torch.randn(cfg["vocab_size"], h, generator=g) * 0.05}
    w["transformer.adapter.weight"] = torch.randn(h, 2 * h, generator=g) * 0.05
    w["transformer.ln_f.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    parts = [("prelude", cfg["n_layers_in_prelude"]), ("core_block", cfg["n_layers_in_recurrent_block"])]
    for part, count in [*parts, ("coda", cfg["n_layers_in_coda"])]:
        for i in range(count):
            p = f"transformer.{part}.{i}."
            for n in range(1, 5):
                w[p + f"norm_{n}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
            w[p + "attn.Wqkv.weight"] = torch.randn(3 * h, h, generator=g) * 0.05
            w[p + "attn.qk_bias"] = torch.randn(2, 1, cfg["n_heads"], hd, generator=g) * 0.1
            w[p + "attn.proj.weight"] = torch.randn(h, h, generator=g) * 0.05
            w[p + "mlp.fc.weight"] = torch.randn(2 * inter, h, generator=g) * 0.05
            w[p + "mlp.proj.weight"] = torch.randn(h, inter, generator=g) * 0.05
    stored = dict(w)
    if with_head:
        stored["lm_head.weight"] = w["transformer.wte.weight"].clone()
    if with_freqs:
        stored["freqs_cis"] = torch.randn(1, cfg["block_size"], 1, hd // 2, 2)
    names = sorted(stored)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: stored[k].contiguous() for k in keys}, str(folder / file))
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(
        json.dumps({**cfg, "model_type": "huginn_raven", "torch_dtype": "float32"})
    )
    return w


@pytest.mark.parametrize(("with_freqs", "with_head"), [(True, True), (False, False)])
def test_huginn_layout_checkpoint_loads_and_matches_reference_math(tmp_path, with_freqs, with_head):
    cfg = dict(
        n_embd=32,
        n_heads=4,
        n_layers_in_prelude=1,
        n_layers_in_recurrent_block=2,
        n_layers_in_coda=1,
        intermediate_size=48,
        vocab_size=40,
        block_size=64,
        rope_base=50000.0,
        norm_eps=1e-6,
        mean_recurrence=4,
        mean_backprop_depth=2,
        tie_embeddings=True,
        qk_bias=True,
        sampling_scheme="poisson-lognormal-filling",
        init_strategy="takase",
    )
    weights = random_huginn_checkpoint(tmp_path, cfg, with_freqs, with_head)
    model = RecurrentDepthLM.from_pretrained(tmp_path)
    ids = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(2))
    for r in (1, 3):
        ours = model(ids, num_steps=r, init_scale=0.0).logits
        torch.testing.assert_close(ours, reference_forward(weights, cfg, ids, r), atol=1e-5, rtol=1e-5)
    assert model.config.extra["init_strategy"] == "takase"


def test_save_then_load_gives_identical_logits(tmp_path, tiny_lm):
    ids = torch.randint(0, 96, (2, 11))
    before = tiny_lm(ids, num_steps=3, init_scale=0.0).logits
    tiny_lm.save_pretrained(tmp_path / "ckpt")
    loaded = RecurrentDepthLM.from_pretrained(tmp_path / "ckpt")
    assert torch.equal(loaded(ids, num_steps=3, init_scale=0.0).logits, before)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["model_type"] == "huginn_raven" and config["n_layers_in_recurrent_block"] == 2
    assert loaded.lm_head.weight is loaded.transformer.wte.weight


def test_full_huginn_size_on_meta_device_has_3_5b_parameters():
    with torch.device("meta"):
        model = RecurrentDepthLM(RecurrentDepthConfig(**HUGINN_BIG))
    assert 3.4e9 < model.num_parameters() < 3.7e9


def test_initial_state_statistics_and_zero_scale(tiny_lm):
    embeds = torch.zeros(4, 256, 64)
    state = tiny_lm.initialize_state(embeds, init_scale=1.0)
    # std sqrt(2/5h) truncated at 3 std, times sqrt(h): about 0.63 whatever h is
    assert 0.58 < state.std().item() < 0.66
    assert state.abs().max() <= 3 * math.sqrt(2 / (5 * 64)) * 8 + 1e-5
    assert torch.equal(tiny_lm.initialize_state(embeds, init_scale=0.0), torch.zeros_like(embeds))


def test_gradients_reach_only_the_last_k_iterations():
    torch.manual_seed(0)
    model = RecurrentDepthLM(tiny_config()).train()
    calls_with_grad = []
    model.transformer.adapter.register_forward_hook(lambda m, i, o: calls_with_grad.append(o.requires_grad))
    ids = torch.randint(0, 96, (2, 6))
    out = model(ids, num_steps=(5, 2), labels=ids, return_trajectory=True)
    assert calls_with_grad == [False] * 5 + [True] * 2
    out.loss.backward()
    assert model.transformer.adapter.weight.grad.abs().sum() > 0
    # the initial state receives a gradient only when no iteration ran without one
    for steps, reaches in (((0, 3), True), ((1, 3), False)):
        start = torch.randn(2, 6, 64, requires_grad=True)
        model(ids, num_steps=steps, labels=ids, input_states=start).loss.backward()
        assert (start.grad is not None) == reaches
    # int depth while training: the last mean_backprop_depth iterations carry gradients
    assert model.resolve_steps(7) == (7 - model.config.mean_backprop_depth, model.config.mean_backprop_depth)


def test_bad_checkpoint_folders_give_one_line_errors(tmp_path, tiny_lm):
    with pytest.raises(UsageError, match="does not exist"):
        RecurrentDepthLM.from_pretrained(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        RecurrentDepthLM.from_pretrained(tmp_path / "bad")
    tiny_lm.save_pretrained(tmp_path / "ok")
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    config["intermediate_size"] = 64
    (tmp_path / "ok" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="does not match the weights"):
        RecurrentDepthLM.from_pretrained(tmp_path / "ok")
    (tmp_path / "trunc").mkdir()
    (tmp_path / "trunc" / "config.json").write_text(json.dumps(config))
    (tmp_path / "trunc" / "model.safetensors").write_bytes(b"\x10\x00\x00")
    with pytest.raises(UsageError, match="not a readable safetensors"):
        RecurrentDepthLM.from_pretrained(tmp_path / "trunc")
