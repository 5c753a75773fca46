"""Training throughput and model-FLOPs utilisation (MFU) of a recurrent-depth LM on this machine.

Prints one JSON object. The peak is measured in the same run (best of several large fp32 matmuls), and the
model's FLOPs are counted honestly per training step:

- layers run with gradient (prelude, coda, head, and the last ``k`` core iterations): 6 FLOPs per weight per
  token (forward 2, backward 4);
- core iterations without gradient: 2 FLOPs per weight per token;
- causal attention scores and mixing: ``4 * h * (T + 1) / 2`` per token per layer forward (only the unmasked
  half of the T x T score matrix), times 3 with gradient;
- embedding lookups, norms, RoPE and the optimizer are not counted (they are the overhead MFU exposes).

Usage: ``python benchmarks/train_throughput.py [--config configs/lm-arithmetic.yaml] [--batch-size 128]
[--seq-len 12] [--depth 8] [--steps 5] [--profile]``.
"""

from __future__ import annotations

import json
import platform
import time

import torch
from torch.profiler import ProfilerActivity, profile

from latentloop.config import from_dict, load_yaml
from latentloop.errors import ArgumentParser
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.paths import CONFIGS_DIR
from latentloop.train.optim import build_optimizer


def measure_peak(size: int = 2048, seconds: float = 2.0) -> float:
    """Best fp32 matmul rate (FLOP/s) over ~``seconds`` of ``size``-square products."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def flops_per_token(config: RecurrentDepthConfig, seq_len: int, no_grad: int, with_grad: int) -> dict:
    """Model FLOPs per token of one training step, split by part (see the module docstring)."""
    h, inter, vocab = config.n_embd, config.intermediate_size, config.vocab_size
    block_weights = 3 * h * h + h * h + 2 * h * inter + inter * h  # Wqkv, proj, fc (gate+up), mlp proj
    attention = 4 * h * (seq_len + 1) / 2  # causal QK^T and AV, forward
    layer = 2 * block_weights + attention  # forward FLOPs of one sandwich layer
    core_iteration = 2 * (2 * h * h) + config.n_layers_in_recurrent_block * layer  # adapter + core layers
    outer = (config.n_layers_in_prelude + config.n_layers_in_coda) * layer + 2 * h * vocab  # + head
    return {
        "with_grad": 3 * (outer + with_grad * core_iteration),
        "no_grad": no_grad * core_iteration,
        "total": 3 * (outer + with_grad * core_iteration) + no_grad * core_iteration,
    }


def _parser() -> ArgumentParser:
    """The command line of :func:`main`."""
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIGS_DIR / "lm-arithmetic.yaml"))
    parser.add_argument("--batch-size", type=int, default=None, help="default: the config's train.batch_size")
    parser.add_argument("--seq-len", type=int, default=12, help="12 = a 3-digit addition example")
    parser.add_argument(
        "--depth", type=int, default=None, help="total core iterations (default: mean_recurrence)"
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--n-embd", type=int, default=None)
    parser.add_argument("--profile", action="store_true", help="add the top CPU ops of one profiled step")
    return parser


def main() -> None:
    args = _parser().parse_args()

    data = load_yaml(args.config)

    model_data = dict(data.get("model", {}))
    if args.n_embd:
        model_data["n_embd"] = args.n_embd
        model_data["intermediate_size"] = round(args.n_embd * 2.75 / 64) * 64  # 704 at 256, like the config
    model_data["block_size"] = max(int(model_data.get("block_size", 512)), args.seq_len)
    config = from_dict(RecurrentDepthConfig, model_data)
    batch = args.batch_size or int(data.get("train", {}).get("batch_size", 64))
    depth = args.depth or config.mean_recurrence
    with_grad = min(config.mean_backprop_depth, depth)
    no_grad = depth - with_grad

    peak = measure_peak()
    torch.manual_seed(0)
    model = RecurrentDepthLM(config).train()
    optimizer = build_optimizer(model, 1e-3)
    inputs = torch.randint(0, config.vocab_size, (batch, args.seq_len))

    def step() -> None:
        out = model(inputs, num_steps=(no_grad, with_grad), labels=inputs)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: allocator, kernels
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    step_time = sorted(times)[len(times) // 2]  # median: robust to other work on a shared machine
    tokens = batch * args.seq_len
    flops = flops_per_token(config, args.seq_len, no_grad, with_grad)
    achieved = flops["total"] * tokens / step_time
    report = {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "model": {
            "n_embd": config.n_embd,
            "layers": [
                config.n_layers_in_prelude,
                config.n_layers_in_recurrent_block,
                config.n_layers_in_coda,
            ],
            "intermediate_size": config.intermediate_size,
            "parameters": model.num_parameters(),
        },
        "batch_size": batch,
        "seq_len": args.seq_len,
        "depth": {"no_grad": no_grad, "with_grad": with_grad},
        "step_time_s": round(step_time, 4),
        "tokens_per_s": round(tokens / step_time, 1),
        "model_gflop_per_token": round(flops["total"] / 1e9, 4),
        "achieved_gflops": round(achieved / 1e9, 1),
        "peak_fp32_gflops": round(peak / 1e9, 1),
        "mfu": round(achieved / peak, 4),
    }
    if args.profile:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events) or 1
        report["top_ops"] = [
            {"op": e.key, "share": round(e.self_cpu_time_total / total, 3)} for e in events[:6]
        ]
        report["matmul_share"] = round(
            sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
            / total,
            3,
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
