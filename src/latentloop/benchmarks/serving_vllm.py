"""vLLM with latentloop's plugin: the tokens/s of a batch of concurrent requests against latentloop's `generate`
called one request at a time, on a random model of either family's official layout (serving.py's shapes: head
dimension 64, about 50M parameters and more). Runs in the environment of scripts/setup-vllm.sh:

    .venv-vllm/bin/python benchmarks/serving_vllm.py --random huginn --requests 16 --max-tokens 64 --threads 2

Every request is greedy, from a zero initial state. Each repeat runs the `--requests` prompts (8-63 tokens)
through `generate` one after the other, then the same prompts through one `vllm.LLM` at once, which schedules
them as concurrent requests (continuous batching, paged caches); tokens/s is completion tokens over wall time,
and the ratio is the median of the per-repeat ratios. vLLM's tokens are compared with `generate`'s, request by
request. vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, in fp32. Prints one JSON object.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import torch

from latentloop.benchmarks.serving import RANDOM_SHAPES, random_model
from latentloop.errors import ArgumentParser, UsageError, whole_number
from latentloop.io import atomic_write_text
from latentloop.models.generation import generate
from latentloop.models.looped_lms import load_looped_lm

try:
    import vllm
except ImportError:
    vllm = None


def prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 64, (count,), generator=generator).tolist()
    return [torch.randint(1, 256, (n,), generator=generator).tolist() for n in lengths]


def measure(args, folder: Path) -> dict:
    model = load_looped_lm(folder)
    requests = prompts(args.requests)
    llm = vllm.LLM(
        str(folder), dtype="float32", skip_tokenizer_init=True, max_model_len=256, enforce_eager=True
    )
    params = vllm.SamplingParams(max_tokens=args.max_tokens, temperature=0, detokenize=False, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in requests]
    tokens = args.requests * args.max_tokens
    rounds, identical = [], []
    # One untimed pass each way first: the first call of a process pays for allocations and warm-up.
    torch.set_num_threads(args.threads)
    generate(model, torch.tensor([requests[0]]), max_new_tokens=2, init_scale=0.0)
    llm.generate(
        batch[:1], vllm.SamplingParams(max_tokens=2, temperature=0, detokenize=False), use_tqdm=False
    )
    for _ in range(args.repeats):
        torch.set_num_threads(args.threads)
        started = time.perf_counter()
        alone = [
            generate(model, torch.tensor([p]), max_new_tokens=args.max_tokens, init_scale=0.0)
            .sequences[0, len(p) :]
            .tolist()
            for p in requests
        ]
        generate_seconds = time.perf_counter() - started
        started = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        vllm_seconds = time.perf_counter() - started
        identical.append([list(o.outputs[0].token_ids) for o in outputs] == alone)
        rounds.append(
            {
                "generate_tokens_per_second": tokens / generate_seconds,
                "vllm_tokens_per_second": tokens / vllm_seconds,
            }
        )
    del llm
    gc.collect()
    return {
        "median": {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]},
        "vllm_over_generate": round(
            statistics.median(r["vllm_tokens_per_second"] / r["generate_tokens_per_second"] for r in rounds),
            3,
        ),
        "tokens_identical_to_generate": all(identical),
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--random", choices=sorted(RANDOM_SHAPES), required=True, help="a random model's layout"
    )
    parser.add_argument("--requests", type=whole_number(1), default=16, help="concurrent requests")
    parser.add_argument("--max-tokens", type=whole_number(1), default=64, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (the median is reported)")
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads of generate"
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if vllm is None:
        print(
            "error: vLLM is not installed: run scripts/setup-vllm.sh, then use .venv-vllm/bin/python",
            file=sys.stderr,
        )
        return 2
    shape = RANDOM_SHAPES[args.random]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch) / args.random
            result = {
                "benchmark": "serving_vllm",
                "model": f"random {args.random}",
                "parameters": random_model(args.random, folder),
                "depth": shape.get("mean_recurrence", shape.get("total_ut_steps")),
                "requests": args.requests,
                "max_tokens": args.max_tokens,
                "threads": args.threads,
                "machine": platform.processor() or platform.machine(),
                "vllm": vllm.__version__,
                "torch": torch.__version__,
                **measure(args, folder),
            }
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        atomic_write_text(args.output, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
