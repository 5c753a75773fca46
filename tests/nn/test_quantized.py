"""Weight-only int8: the row quantization's exact values, each kernel against the dequantized product, and the
quantized copy of a model (shared and tied weights, a quarter of the bytes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.nn.quantized import (
    Int8Embedding,
    Int8Linear,
    activation_dtype,
    is_quantized,
    quantize_rows,
    quantize_weights,
    weight_bytes,
)
from tests.conftest import tiny_config


def test_each_row_is_rounded_on_its_own_scale():
    weight = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [0.3, 0.0, -0.1]])
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.tolist() == pytest.approx([2 / 127, 1.0, 0.3 / 127])
    # 1 / (2/127) = 63.5 rounds to even; an all-zero row keeps scale 1; the largest entry maps to +-127.
    assert q.tolist() == [[64, -127, 32], [0, 0, 0], [127, 0, -42]]


def dequantized(layer: Int8Linear) -> torch.Tensor:
    return layer.weight.float() * layer.scale[:, None]


@pytest.fixture
def layer() -> Int8Linear:
    torch.manual_seed(0)
    return Int8Linear.of(nn.Linear(96, 40))


def test_the_eager_kernel_is_the_dequantized_product_on_bf16_rows(layer):
    x = torch.randn(3, 5, 96)
    expected = F.linear(x.bfloat16().float(), dequantized(layer), layer.bias)
    out = layer(x)
    assert out.shape == (3, 5, 40) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=0.05, rtol=0.02)


def test_one_row_in_a_compiled_graph_keeps_fp32_activations(layer):
    x = torch.randn(1, 1, 96)
    out = torch.compile(layer, fullgraph=True)(x)
    torch.testing.assert_close(out, F.linear(x, dequantized(layer), layer.bias), atol=1e-5, rtol=1e-5)
    rows = torch.randn(4, 96)  # several rows take the kernel, as an opaque call inside the graph
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(rows), layer(rows))


def test_an_embedding_looks_up_its_dequantized_rows():
    torch.manual_seed(0)
    table = nn.Embedding(50, 16)
    embedding = Int8Embedding.of(table)
    ids = torch.tensor([[3, 49, 3]])
    expected = embedding.weight[ids].float() * embedding.scale[ids, None]
    assert torch.equal(embedding(ids), expected)
    assert (embedding(ids) - table(ids)).abs().max() <= embedding.scale.max() / 2 + 1e-7


def test_the_copy_shares_everything_but_the_quantized_weights():
    torch.manual_seed(0)
    model = RecurrentDepthLM(tiny_config()).eval()
    quantized = quantize_weights(model)
    assert is_quantized(quantized) and not is_quantized(model)
    assert isinstance(model.lm_head, nn.Linear)  # the original is left as it was
    assert isinstance(quantized.lm_head, Int8Linear) and isinstance(quantized.transformer.wte, Int8Embedding)
    assert quantized.lm_head.weight is quantized.transformer.wte.weight  # tied: quantized once
    assert quantized.transformer.ln_f.weight is model.transformer.ln_f.weight
    assert activation_dtype(quantized.embedding) == torch.float32
    assert weight_bytes(quantized) <= 0.3 * weight_bytes(model)
    with pytest.raises(UsageError, match="already quantized"):
        quantize_weights(quantized)
    with pytest.raises(UsageError, match="weights must be one of int8"):
        quantize_weights(model, "int4")


def test_the_kernels_scales_follow_the_layers_scales(layer):
    """The eager kernel keeps the scales in bf16; a changed or replaced scale tensor is read again."""
    x = torch.randn(2, 96)
    before = layer(x)
    with torch.no_grad():
        layer.scale.mul_(2)
    torch.testing.assert_close(layer(x), 2 * (before - layer.bias) + layer.bias)
    layer.scale = torch.ones(40)
    torch.testing.assert_close(
        layer(x), F.linear(x.bfloat16().float(), layer.weight.float(), layer.bias), atol=0.5, rtol=0.02
    )


def test_a_model_quantized_in_inference_mode_decodes():
    """Tensors made in inference mode keep no version count; the kernel's scales are read all the same."""
    torch.manual_seed(0)
    with torch.inference_mode():
        layer = Int8Linear.of(nn.Linear(96, 40))
        x = torch.randn(2, 96)
        torch.testing.assert_close(
            layer(x), F.linear(x.bfloat16().float(), dequantized(layer), layer.bias), atol=0.05, rtol=0.02
        )
