"""The linear layer that compiled decoding graphs multiply as row dot products."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentloop.nn import Linear
from latentloop.nn.linear import ROW_DOT_MAX_ROWS


def traced_calls(layer: nn.Module, x: torch.Tensor) -> tuple[set[str], torch.Tensor]:
    """The names of the functions and methods in the graph Dynamo traces for ``layer(x)``, and its output."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(layer, backend=record, fullgraph=True, dynamic=False)(x)
    calls = {getattr(n.target, "__name__", str(n.target)) for g in graphs for n in g.graph.nodes}
    return calls, out


@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48)])
def test_compiled_single_rows_are_row_dot_products(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layer = Linear(48, 80)
    x = torch.randn(shape)
    calls, out = traced_calls(layer, x)
    assert "linear" not in calls and {"mul", "sum"} <= calls
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)


def test_compiled_many_rows_and_eager_take_the_matrix_kernel() -> None:
    torch.manual_seed(0)
    layer = Linear(48, 80, bias=False)
    x = torch.randn(ROW_DOT_MAX_ROWS + 1, 48)
    calls, out = traced_calls(layer, x)
    assert "linear" in calls and "sum" not in calls
    assert torch.equal(out, F.linear(x, layer.weight))
    one = torch.randn(1, 48)
    assert torch.equal(layer(one), F.linear(one, layer.weight))  # eager: never the row form


def test_is_an_nn_linear_with_its_state_dict() -> None:
    layer = Linear(8, 4)
    plain = nn.Linear(8, 4)
    plain.load_state_dict(layer.state_dict())
    assert isinstance(layer, nn.Linear) and set(layer.state_dict()) == {"weight", "bias"}
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), plain(x))
