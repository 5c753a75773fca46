"""Decoding at released models' shapes (random weights) with fp32, bf16 and int8 weights, against the bandwidth limit.

    latentloop bench int8_decoding [--shapes ouro-1.4b,huginn-0125] [--depths 4] [--batches 1,8]
                                   [--tokens 4] [--repeats 3] [--modes eager,compiled] [--threads 2]
                                   [--layer] [--output FILE]

A looped LM reads its core's weights once per loop step, so decoding a row is bound by memory bandwidth. For
each shape, the model is built once with random weights (fp32), quantized to int8
(:func:`latentloop.nn.quantized.quantize_weights`), and later cast to bf16 in place. Greedy decoding from an
8-token prompt is timed with ``--tokens`` new tokens and with one; their difference over the tokens between
is the decoding time alone (prefill left out). fp32 and int8 are timed in alternation, then bf16 and int8
(medians of ``--repeats``). Reported for each format, mode, batch and depth: tokens/s, the weight bytes read
per decoded token (counted by hooks on every linear layer during one token), the weight memory, the
tokens/s the machine's bandwidth allows at batch 1 (``bandwidth`` / bytes per token; the bandwidth is the
fastest read of a 1 GiB array, by a sum or a matrix-vector product, on the same threads), whether int8's
tokens equal fp32's, and the process's peak resident memory. ``--layer`` also times one Ouro-1.4B MLP projection (2048 → 5632, one row) with each
kernel: fp32, bf16, int8 through PyTorch's kernel and as compiled row dot products, int4 through PyTorch's
kernel (group 128), and torchao's int8 weight-only tensors when torchao is installed.
"""

from __future__ import annotations

import copy
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from latentloop.errors import ArgumentParser, whole_number
from latentloop.io import emit_json_report
from latentloop.models.generation import generate
from latentloop.models.ouro import OuroConfig, OuroLM
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.nn.quantized import Int8Linear, quantize_weights, weight_bytes
from latentloop.nn.rope import RotaryEmbedding
from latentloop.runtime import cpu_description

try:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
except ImportError:  # torchao is optional: its row is left out
    quantize_ = None

PROMPT = 8
SHAPES: dict[str, Callable[[], nn.Module]] = {
    "ouro-1.4b": lambda: OuroLM(
        OuroConfig(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            vocab_size=49152,
            max_position_embeddings=512,
        )
    ),
    "huginn-0125": lambda: RecurrentDepthLM(
        RecurrentDepthConfig(
            n_embd=5280,
            n_heads=55,
            n_layers_in_prelude=2,
            n_layers_in_recurrent_block=4,
            n_layers_in_coda=2,
            intermediate_size=17920,
            vocab_size=65536,
            block_size=512,
            mean_recurrence=32,
        )
    ),
    "small": lambda: OuroLM(OuroConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4)),
}


def random_model(shape: str) -> nn.Module:
    """The shape's model with random weights (N(0, 0.02); norms and biases 1 and 0), built without running its
    initialisation, which takes minutes at these sizes."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = SHAPES[shape]()
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.02)
            else:
                parameter.fill_(0.0 if name.endswith("bias") else 1.0)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.rotations = module.cos_sin()
    if isinstance(model, RecurrentDepthLM) and model.config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    return model.eval()


def bandwidth_gb_s(repeats: int = 7) -> float:
    """The machine's memory bandwidth on torch's threads: the fastest of ``repeats`` reads of 1 GiB of fp32 by a
    sum and by a matrix-vector product (GB/s). A limit is a best case, so the largest reading counts."""
    array = torch.ones(2**28)
    matrix, vector = array.view(2**14, 2**14), torch.ones(2**14)
    best = 0.0
    for read in (array.sum, lambda: torch.mv(matrix, vector)):
        read()
        for _ in range(repeats):
            started = time.perf_counter()
            read()
            best = max(best, array.numel() * 4 / (time.perf_counter() - started) / 1e9)
    return best


def bytes_per_token(model: nn.Module, prompt: torch.Tensor, depth: int) -> int:
    """Weight bytes the linear layers read to decode one token at ``depth`` (one row)."""
    read = [0]

    def count(module: nn.Module, inputs: Any, output: Any) -> None:
        weight = module.weight
        read[0] += weight.numel() * weight.element_size()
        if isinstance(module, Int8Linear):
            read[0] += module.scale.numel() * module.scale.element_size()

    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, Int8Linear))]
    handles = [layer.register_forward_hook(count) for layer in layers]
    try:
        totals = []
        for tokens in (1, 2):
            read[0] = 0
            generate(model, prompt[:1], max_new_tokens=tokens, num_steps=depth, init_scale=0.0)
            totals.append(read[0])
    finally:
        for handle in handles:
            handle.remove()
    return totals[1] - totals[0]


def timed(model: nn.Module, prompt: torch.Tensor, depth: int, tokens: int, compiled: bool) -> float:
    started = time.perf_counter()
    generate(model, prompt, max_new_tokens=tokens, num_steps=depth, init_scale=0.0, compile=compiled)
    return time.perf_counter() - started


def race(
    models: dict[str, nn.Module], prompt: torch.Tensor, depth: int, tokens: int, compiled: bool, repeats: int
) -> dict[str, float]:
    """Decoding tokens/s of each model, timed in alternation: (tokens - 1) x batch over the time between a
    call of ``tokens`` and a call of one (the prefill cancels), medians of ``repeats``."""
    for model in models.values():  # compiles, and warms the caches
        timed(model, prompt, depth, 2, compiled)
    spans: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            whole = timed(model, prompt, depth, tokens, compiled)
            spans[name].append(whole - timed(model, prompt, depth, 1, compiled))
    return {name: prompt.shape[0] * (tokens - 1) / statistics.median(s) for name, s in spans.items()}


def same_tokens(a: nn.Module, b: nn.Module, prompt: torch.Tensor, depth: int, tokens: int) -> float:
    """The share of greedy tokens ``b`` gives that ``a`` gives too."""
    x = generate(a, prompt, max_new_tokens=tokens, num_steps=depth, init_scale=0.0).sequences[:, PROMPT:]
    y = generate(b, prompt, max_new_tokens=tokens, num_steps=depth, init_scale=0.0).sequences[:, PROMPT:]
    return float((x == y).float().mean())


def shape_rows(shape: str, args: Any, bandwidth: float) -> dict[str, Any]:
    model = random_model(shape)
    int8 = quantize_weights(model)
    for module in int8.modules():  # its own norms and biases: the float model is cast to bf16 in place below
        for name, parameter in module.named_parameters(recurse=False):
            setattr(module, name, nn.Parameter(parameter.detach().clone(), requires_grad=False))
    vocab = model.config.vocab_size
    prompts = {
        b: torch.randint(1, vocab, (b, PROMPT), generator=torch.Generator().manual_seed(1))
        for b in args.batches
    }
    memory = {"fp32": weight_bytes(model), "int8": weight_bytes(int8)}
    read = {"fp32": {}, "int8": {}, "bf16": {}}
    rows = []
    for depth in args.depths:
        read["fp32"][depth] = bytes_per_token(model, prompts[args.batches[0]], depth)
        read["int8"][depth] = bytes_per_token(int8, prompts[args.batches[0]], depth)
    agree = {d: same_tokens(model, int8, prompts[max(args.batches)], d, args.tokens) for d in args.depths}
    speeds: dict[tuple[str, str, int, int], float] = {}
    for rounds in (("fp32", "int8"), ("bf16", "int8")):
        if rounds[0] == "bf16":
            model.to(torch.bfloat16)
            memory["bf16"] = weight_bytes(model)
            for depth in args.depths:
                read["bf16"][depth] = bytes_per_token(model, prompts[args.batches[0]], depth)
        pair = {rounds[0]: model, "int8": int8}
        for mode in args.modes:
            torch._dynamo.reset()
            for batch in args.batches:
                for depth in args.depths:
                    got = race(pair, prompts[batch], depth, args.tokens, mode == "compiled", args.repeats)
                    for name, value in got.items():
                        speeds[
                            (name if name != "int8" else f"int8 (beside {rounds[0]})", mode, batch, depth)
                        ] = value
    for (name, mode, batch, depth), value in speeds.items():
        fmt = name.split()[0]
        limit = bandwidth * 1e9 / read[fmt][depth]
        rows.append(
            {
                "weights": name,
                "mode": mode,
                "batch": batch,
                "depth": depth,
                "tokens_per_second": round(value, 3),
                "bytes_per_token": read[fmt][depth],
                "bandwidth_limit_tokens_per_second": round(limit, 3),
                "share_of_limit": round(value / batch / limit, 3) if batch == 1 else None,
            }
        )
    return {
        "shape": shape,
        "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "weight_bytes": memory,
        "int8_tokens_agreeing_with_fp32": {str(d): round(a, 4) for d, a in agree.items()},
        "rows": rows,
    }


def layer_rows(repeats: int) -> list[dict[str, Any]]:
    """One 2048 → 5632 projection of one row with each kernel, in alternation (ms, medians)."""
    torch.manual_seed(0)
    linear = nn.Linear(2048, 5632, bias=False).eval()
    x = torch.randn(1, 2048)
    q8 = Int8Linear.of(linear)
    bf16 = copy.deepcopy(linear).to(torch.bfloat16)
    group = 128
    weight = linear.weight.detach().view(5632, -1, group)
    low, high = weight.amin(-1), weight.amax(-1)
    step = ((high - low) / 15).clamp(min=1e-8)
    q4 = (
        torch.round((weight - low[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32).view(5632, 2048)
    )
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 1)
    scales_zeros = torch.stack([step.t(), (low + 8 * step).t()], -1).contiguous().bfloat16()
    row_dot = torch.compile(q8)
    kernels: dict[str, Callable[[], Any]] = {
        "fp32": lambda: linear(x),
        "bf16": lambda: bf16(x.bfloat16()),
        "int8 kernel (bf16 rows)": lambda: q8(x),
        "int8 compiled row dots": lambda: row_dot(x),
        "int4 kernel (group 128, bf16 rows)": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.bfloat16(), packed, group, scales_zeros
        ),
    }
    if quantize_ is not None:
        torchao_layer = copy.deepcopy(linear)
        quantize_(torchao_layer, Int8WeightOnlyConfig())
        kernels["torchao int8 weight-only"] = lambda: torchao_layer(x)
    with torch.inference_mode():
        for run in kernels.values():
            for _ in range(3):
                run()
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(repeats):
            for name, run in kernels.items():
                started = time.perf_counter()
                for _ in range(10):
                    run()
                times[name].append((time.perf_counter() - started) / 10 * 1e3)
    fp32 = statistics.median(times["fp32"])
    return [
        {
            "kernel": name,
            "ms": round(statistics.median(t), 4),
            "speedup_over_fp32": round(fp32 / statistics.median(t), 2),
        }
        for name, t in times.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="ouro-1.4b", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--depths", default="4", help="loop steps per token, comma-separated")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--tokens", type=whole_number(2), default=4, help="new tokens per timed call")
    parser.add_argument("--repeats", type=whole_number(1), default=3, help="timed runs of each (medians)")
    parser.add_argument("--modes", default="eager,compiled", help="eager, compiled or both")
    parser.add_argument("--threads", type=whole_number(1), default=2, help="torch threads")
    parser.add_argument("--layer", action="store_true", help="also time one projection with each kernel")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape {unknown[0]!r} (known: {', '.join(SHAPES)})")
    modes = args.modes.split(",")
    if not set(modes) <= {"eager", "compiled"}:
        parser.error("--modes takes eager, compiled or both")
    try:
        args.depths = [int(d) for d in args.depths.split(",")]
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error("--depths and --batches take whole numbers, comma-separated")
    if min(args.depths) < 1 or min(args.batches) < 1:
        parser.error("--depths and --batches must be at least 1")
    args.modes = modes
    torch.set_num_threads(args.threads)
    bandwidth = bandwidth_gb_s()
    report: dict[str, Any] = {
        "benchmark": "int8_decoding",
        "environment": {"cpu": cpu_description(), "torch": torch.__version__, "threads": args.threads},
        "bandwidth_gb_s": round(bandwidth, 2),
        "prompt_len": PROMPT,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "shapes": [],
    }
    if args.layer:
        report["layer"] = layer_rows(max(args.repeats, 5))
    with torch.inference_mode():
        for shape in shapes:
            report["shapes"].append(shape_rows(shape, args, bandwidth))
    report["peak_resident_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    emit_json_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
