import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.reasoners import build_reasoner
from latentloop.models.reasoners.base import ReasonerConfig
from latentloop.nn import (
    Attention,
    AxialRotaryEmbedding,
    RMSNorm,
    RotaryEmbedding,
    SandwichBlock,
    apply_rope,
    compile_blocks,
)
from latentloop.nn.attention import attend


def test_rmsnorm_normalises_in_fp32_and_returns_input_dtype():
    norm = RMSNorm(8, eps=1e-6).to(torch.bfloat16)
    x = torch.randn(3, 8, dtype=torch.bfloat16) * 100
    out = norm(x)
    assert out.dtype == torch.bfloat16
    x32 = x.float()
    expected = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, atol=0, rtol=0.01)


def test_rope_rotates_adjacent_pairs_like_complex_multiplication():
    rope = RotaryEmbedding(head_dim=8, max_positions=16, base=50_000)
    x = torch.randn(1, 5, 2, 8)
    rotated = apply_rope(x, rope.tables(torch.arange(5)))
    # the real-arithmetic form of the reference: (x0 cos - x1 sin, x1 cos + x0 sin) on adjacent pairs
    angles = torch.outer(torch.arange(5.0), 1.0 / 50_000 ** (torch.arange(0, 8, 2) / 8))[None, :, None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    expected = torch.stack([x0 * angles.cos() - x1 * angles.sin(), x1 * angles.cos() + x0 * angles.sin()], -1)
    torch.testing.assert_close(rotated, expected.flatten(-2))
    # position 0 is the identity; rotate-half would fail the complex check above
    torch.testing.assert_close(rotated[:, 0], x[:, 0])


def test_rope_tables_stay_fp32_when_the_model_is_cast_to_bf16():
    rope = RotaryEmbedding(head_dim=8, max_positions=4096)
    exact = rope.tables(torch.tensor([4000]))
    rope = rope.to(torch.bfloat16)
    assert rope.rotations.dtype == torch.float32
    # a bf16 table would round cos/sin of large angles by up to 2^-9
    torch.testing.assert_close(rope.tables(torch.tensor([4000])), exact, atol=0, rtol=0)


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(head_dim=8, max_positions=64, base=10_000)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rope(q, rope.tables(torch.tensor([m])))
        kn = apply_rope(k, rope.tables(torch.tensor([n])))
        return (qm * kn).sum()

    torch.testing.assert_close(score(7, 3), score(30, 26))


def test_axial_rope_scores_depend_on_the_row_and_column_offsets():
    rope = AxialRotaryEmbedding(head_dim=16, max_positions=64, width=8)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: tuple[int, int], n: tuple[int, int]) -> torch.Tensor:
        qm = apply_rope(q, rope.tables(torch.tensor([m[0] * 8 + m[1]])))
        kn = apply_rope(k, rope.tables(torch.tensor([n[0] * 8 + n[1]])))
        return (qm * kn).sum()

    # the same offset of (2 rows, -3 columns) anywhere on the board gives the same score
    torch.testing.assert_close(score((1, 5), (3, 2)), score((4, 7), (6, 4)))
    # one step along the flat sequence is one column inside a row but a new row at its end: 1-D RoPE
    # scores both alike, the grid's rows and columns tell them apart
    assert not torch.allclose(score((0, 7), (1, 0)), score((0, 0), (0, 1)))
    flat = RotaryEmbedding(head_dim=16, max_positions=64)
    flat_score = [
        (apply_rope(q, flat.tables(torch.tensor([a]))) * apply_rope(k, flat.tables(torch.tensor([b])))).sum()
        for a, b in ((7, 8), (0, 1))
    ]
    torch.testing.assert_close(*flat_score)


def test_rope_grid_builds_axial_tables_and_rejects_a_width_that_does_not_fit():
    model = build_reasoner("trm", ReasonerConfig(vocab_size=3, seq_len=16, dim=16, n_heads=2, rope_grid=4))
    assert isinstance(model.rope, AxialRotaryEmbedding)
    flat = build_reasoner("trm", ReasonerConfig(vocab_size=3, seq_len=16, dim=16, n_heads=2))
    assert not isinstance(flat.rope, AxialRotaryEmbedding)
    # AR's sequence is the input, SEP and the answer: two grids, one below the other
    ar = build_reasoner("ar", ReasonerConfig(vocab_size=3, seq_len=16, dim=16, n_heads=2, rope_grid=4))
    assert isinstance(ar.rope, AxialRotaryEmbedding) and ar.rope.max_positions == 32
    with pytest.raises(UsageError, match="rope_grid"):
        ReasonerConfig(vocab_size=3, seq_len=16, dim=16, n_heads=2, rope_grid=5)
    with pytest.raises(UsageError, match="rope_grid"):
        ReasonerConfig(vocab_size=3, seq_len=16, dim=12, n_heads=2, rope_grid=4)  # heads of 6: odd pairs
    with pytest.raises(UsageError, match="rope_grid"):  # the prefix positions are not cells of the grid
        ReasonerConfig(vocab_size=3, seq_len=16, dim=16, n_heads=2, rope_grid=4, puzzles=2)


def test_causal_attention_ignores_future_tokens():
    torch.manual_seed(0)
    attn = Attention(16, 2, qk_bias=True)
    rope = RotaryEmbedding(8, 32).tables(torch.arange(6))
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 16)
    torch.testing.assert_close(attn(x, rope)[:, :4], attn(y, rope)[:, :4])
    bidirectional = attn(x, rope, causal=False)[:, :4]
    assert not torch.allclose(bidirectional, attn(y, rope, causal=False)[:, :4])


def test_attention_mask_hides_padded_keys():
    torch.manual_seed(0)
    attn = Attention(16, 2)
    x = torch.randn(1, 5, 16)
    y = x.clone()
    y[:, 1] = torch.randn(16)  # a padded key: changing it must not matter
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
    mask[..., 1] = False
    mask[..., 1, 1] = True
    out_x, out_y = attn(x, mask=mask), attn(y, mask=mask)
    torch.testing.assert_close(out_x[:, 2:], out_y[:, 2:])


def test_kv_hook_incremental_decoding_matches_full_pass():
    torch.manual_seed(0)
    block = SandwichBlock(16, 2, 32, qk_bias=True)
    rope = RotaryEmbedding(8, 32)
    x = torch.randn(2, 7, 16)
    full = block(x, rope.tables(torch.arange(7)))
    keys, values = [], []

    def hook(k, v):
        keys.append(k)
        values.append(v)
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

    steps = [block(x[:, t : t + 1], rope.tables(torch.tensor([t])), kv_hook=hook) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_compile_blocks_compiles_every_block_and_keeps_outputs_and_weight_names():
    """The compiled model computes what the eager one does, and its checkpoint keys do not change."""
    torch.manual_seed(0)
    config = ReasonerConfig(vocab_size=3, seq_len=16, dim=16, n_heads=2, n_layers=2, hidden=32, mixer="mlp")
    eager = build_reasoner("trm", config)
    compiled = build_reasoner("trm", config)
    compiled.load_state_dict(eager.state_dict())
    assert compile_blocks(compiled) == 2  # TRM's one network of two blocks (sequence-MLP mixer)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batch = {"inputs": torch.randint(0, 3, (4, 16))}
    _, want = eager(eager.initial_carry(batch), batch)
    _, got = compiled(compiled.initial_carry(batch), batch)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_attention_on_a_cpu_runs_its_core_in_fp32(causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 9, 8).to(torch.bfloat16) for _ in range(3))
    in_fp32 = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast alone would run the kernel in bf16
        out = attend(q, k, v, is_causal=causal)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, in_fp32.to(torch.bfloat16), atol=0, rtol=0)
    fp32_inputs = attend(q.float(), k.float(), v.float(), is_causal=causal)
    assert fp32_inputs.dtype == torch.float32 and torch.equal(fp32_inputs, in_fp32)
