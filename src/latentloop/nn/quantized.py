"""Weight-only int8: every linear and embedding weight stored as int8 with one fp32 scale per output row.

A looped LM reads every weight of its core once per loop step, so decoding a row is bound by memory bandwidth
several times over; a quarter of fp32's bytes per weight is worth more here than in an ordinary LM. Row ``i``
of a weight ``W`` is stored as ``q_i = round(W_i / s_i)`` in [-127, 127] with ``s_i = max |W_i| / 127``, and
the layer computes ``(x · q_i) s_i``.

Two kernels compute it on a CPU:

- inside a compiled graph, a single row is multiplied as row dot products, as :func:`latentloop.nn.linear.linear`
  does for fp32; the compiler fuses the int8 → float conversion into its one threaded pass over ``q``, so the
  activations stay in the model's dtype;
- otherwise PyTorch's ``_weight_int8pack_mm``, whose CPU kernel is fast with bf16 activations only: the rows
  are rounded to bf16 for the product, and the result is cast back.

Elsewhere (GPUs) the weight is converted for each product: correct, not fast. torchao's int8 weight-only
tensors were measured too and are not used: on CPU they convert the whole weight at every call
(``latentloop bench int8_decoding``).
"""

from __future__ import annotations

import copy
import itertools

import torch
import torch.nn.functional as F
from torch import nn

from latentloop.errors import UsageError
from latentloop.nn.linear import ROW_DOT_MAX_ROWS

WEIGHT_FORMATS = ("int8",)
"""The weight formats :func:`quantize_weights` writes."""


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)``: ``weight`` [rows, columns] as int8 ``q`` and fp32 scales ``s`` [rows], ``weight ≈ q * s[:, None]``
    (symmetric, one scale per row; an all-zero row gets scale 1)."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


@torch.library.custom_op("latentloop::int8_rows", mutates_args=())
def int8_rows(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` [rows, in] times the int8 ``weight`` [out, in] with row ``scale``, through PyTorch's CPU kernel with
    bf16 activations; the result in ``x``'s dtype. An opaque call in compiled graphs, whose lowering of the
    kernel takes only materialised inputs."""
    out = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), weight, scale.to(torch.bfloat16))
    return out.to(x.dtype)


@int8_rows.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


class Int8Linear(nn.Module):
    """``F.linear(x, q * s[:, None], bias)`` on an int8 weight ``q`` [out, in] and fp32 row scales ``s``.
    Inference only: the weight and scales are buffers."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features))
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    @classmethod
    def of(cls, linear: nn.Linear, rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> Int8Linear:
        """``linear`` quantized, or built on ``rows`` (an int8 weight and its scales shared with another
        module, e.g. a tied embedding)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        q, scale = rows if rows is not None else quantize_rows(linear.weight)
        layer.register_buffer("weight", q)
        layer.register_buffer("scale", scale)
        layer.bias = linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            out = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)
        elif torch.compiler.is_compiling() and x.numel() <= ROW_DOT_MAX_ROWS * x.shape[-1]:
            out = (x.unsqueeze(-2) * self.weight.to(x.dtype)).sum(-1) * self.scale.to(x.dtype)
        elif torch.compiler.is_compiling():
            out = int8_rows(x.reshape(-1, self.in_features), self.weight, self.scale)
            out = out.view(*x.shape[:-1], self.out_features)
        else:  # the kernel called directly: a decoding step makes hundreds of these calls
            rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
            out = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self._bf16_scale())
            out = out.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def _bf16_scale(self) -> torch.Tensor:
        """The scales in bf16, as the kernel takes them; made once for each scale tensor."""
        scale = self.scale  # tensors made in inference mode keep no version count
        key = (id(scale), scale.data_ptr(), None if scale.is_inference() else scale._version)
        cached = self.__dict__.get("_bf16_scales")
        if cached is None or cached[0] != key:
            cached = (key, scale.to(torch.bfloat16))
            self.__dict__["_bf16_scales"] = cached
        return cached[1]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


class Int8Embedding(nn.Module):
    """``nn.Embedding`` on an int8 table [tokens, dim] with one fp32 scale per token; looked-up rows come out in
    ``dtype``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.dtype = num_embeddings, embedding_dim, dtype
        self.register_buffer("weight", torch.zeros(num_embeddings, embedding_dim, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(num_embeddings))

    @classmethod
    def of(
        cls, embedding: nn.Embedding, rows: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> Int8Embedding:
        """``embedding`` quantized, or built on shared ``rows`` as in :meth:`Int8Linear.of`."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.num_embeddings, layer.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        layer.dtype = embedding.weight.dtype
        q, scale = rows if rows is not None else quantize_rows(embedding.weight)
        layer.register_buffer("weight", q)
        layer.register_buffer("scale", scale)
        return layer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.weight[ids].to(self.dtype) * self.scale[ids].unsqueeze(-1)).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


QUANTIZED = (Int8Linear, Int8Embedding)


def is_quantized(module: nn.Module) -> bool:
    """Whether any layer of ``module`` holds quantized weights."""
    return any(isinstance(m, QUANTIZED) for m in module.modules())


def check_weight_format(weights: str | None) -> None:
    """Refuses a weight format other than None (the model's own) and :data:`WEIGHT_FORMATS`, in one line."""
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise UsageError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")


def quantize_weights(module: nn.Module, weights: str = "int8") -> nn.Module:
    """A copy of ``module`` with every ``nn.Linear`` and ``nn.Embedding`` weight in ``weights`` format
    (:data:`WEIGHT_FORMATS`): :class:`Int8Linear` and :class:`Int8Embedding` layers. Every other parameter and
    buffer (norms, biases) is shared with ``module``. A weight two layers share (an output layer tied to the
    embedding) is quantized once and stays shared. Works on a model built on the meta device too (for
    loading a quantized checkpoint)."""
    check_weight_format(weights)
    if is_quantized(module):
        raise UsageError("the model's weights are already quantized")
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    clone = copy.deepcopy(module, memo=shared)
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for parent in list(clone.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (nn.Linear, nn.Embedding)):
                key = id(child.weight)
                if key not in rows:
                    rows[key] = _rows_of(child.weight)
                kind = Int8Linear if isinstance(child, nn.Linear) else Int8Embedding
                setattr(parent, name, kind.of(child, rows[key]))
    return clone


def _rows_of(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if weight.device.type == "meta":  # a skeleton to load a quantized state dict into
        return (
            torch.empty(weight.shape, dtype=torch.int8, device="meta"),
            torch.empty(weight.shape[0], device="meta"),
        )
    return quantize_rows(weight)


def weight_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s distinct parameters and persistent buffers (a tied weight counted once)."""
    tensors = {t.data_ptr(): t for t in itertools.chain(module.parameters(), module.buffers()) if t.numel()}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def activation_dtype(embedding: nn.Module) -> torch.dtype:
    """The dtype of the activations a model computes in, read from its input embedding (quantized or not)."""
    return embedding.dtype if isinstance(embedding, Int8Embedding) else embedding.weight.dtype
