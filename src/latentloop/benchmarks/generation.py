"""Generation benchmark for the recurrent-depth LM: throughput, KV-cache memory and adaptive exit.

Prints one JSON object (and optionally writes it to ``--output``). Every figure is measured in this run;
variants that are compared are run side by side inside each repeat (so a slow moment of a shared machine hits
both), and each ratio is the median of the per-repeat ratios.

Sections:

* ``throughput``: greedy tokens/s at fixed depths (batch 1) with the full KV cache, with KV sharing
  (``kv_share=k``) and without a cache (``use_cache=False``, every token recomputes the whole sequence).
* ``kv_cache_memory``: ``RecurrentKVCache.nbytes()`` after greedy decoding at depth r with ``kv_share=k``
  against no sharing (target ratio <= 1/6 at r=32, k=4).
* ``adaptive_exit``: per exit criterion, mean core iterations per token, tokens/s against fixed depth and
  whether the greedy output is identical to fixed depth.

Without ``--model`` a small random model is used; its exits say nothing about a trained model (the JSON says
which model was used). Usage::

    python benchmarks/generation.py --quick
    python benchmarks/generation.py --model runs/lm/checkpoint --prompt "The capital of France is"
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from latentloop.data.tokenizers import load_tokenizer
from latentloop.errors import ArgumentParser, UsageError
from latentloop.io import emit_json_report
from latentloop.models.generation import GenerationOutput, generate
from latentloop.models.kv_cache import RecurrentKVCache
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

CRITERIA = ("kl:5e-4", "entropy-diff", "latent-diff", "argmax-stability", "cosine")
MEMORY_TARGET = 1 / 6


# Command line -----------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """``"8,32"`` -> ``[8, 32]`` (argparse type)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``--quick`` fills in small defaults for anything not given."""
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="checkpoint folder (config.json + model.safetensors)")
    parser.add_argument("--prompt", help="prompt text (with --model); default: random token ids")
    parser.add_argument("--quick", action="store_true", help="small, fast run")
    parser.add_argument("--depths", type=int_list, help="fixed depths for throughput (default 8,32)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per call (default 32)")
    parser.add_argument("--prompt-len", type=int, help="random prompt length (default 16)")
    parser.add_argument("--repeats", type=int, help="timed repeats; medians are reported (default 5)")
    parser.add_argument("--kv-share", type=int, default=4, help="KV-cache slots with sharing (default 4)")
    parser.add_argument("--memory-depth", type=int, default=32, help="depth for the memory section")
    parser.add_argument("--exit-depth", type=int, help="maximum depth for adaptive exit (default 32)")
    parser.add_argument(
        "--criteria",
        default=",".join(CRITERIA),
        help="exit criteria, comma-separated (name or name:threshold)",
    )
    parser.add_argument("--init-scale", type=float, default=0.0, help="initial-state scale (0 = zeros)")
    parser.add_argument("--skip", default="", help="sections to skip: throughput,memory,exit")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--seed", type=int, default=0)
    # Random-model size (ignored with --model).
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--layers", type=int_list, default=[1, 2, 1], help="prelude,core,coda layers")
    parser.add_argument("--intermediate-size", type=int, default=704)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)

    quick = args.quick
    defaults = {
        "depths": [8] if quick else [8, 32],
        "new_tokens": 12 if quick else 32,
        "prompt_len": 8 if quick else 16,
        "repeats": 2 if quick else 5,
        "exit_depth": 16 if quick else 32,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if len(args.layers) != 3:
        parser.error("--layers takes three numbers: prelude,core,coda")
    for name in ("new_tokens", "prompt_len", "repeats", "kv_share", "memory_depth", "exit_depth", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.prompt is not None and args.model is None:
        parser.error("--prompt needs --model (a random model has no tokenizer)")
    args.skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    unknown = args.skip - {"throughput", "memory", "exit"}
    if unknown:
        parser.error(f"unknown section(s) in --skip: {', '.join(sorted(unknown))}")
    args.criteria = [part.strip() for part in args.criteria.split(",") if part.strip()]
    return args


# Model and prompt -------------------------------------------------------------------------------------------


def random_model(args: argparse.Namespace, block_size: int) -> RecurrentDepthLM:
    """A small randomly initialised fp32 model (seeded)."""
    prelude, core, coda = args.layers
    config = RecurrentDepthConfig(
        n_embd=args.n_embd,
        n_heads=args.n_heads,
        n_layers_in_prelude=prelude,
        n_layers_in_recurrent_block=core,
        n_layers_in_coda=coda,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        block_size=block_size,
    )
    torch.manual_seed(args.seed)
    return RecurrentDepthLM(config)


def encode_prompt(text: str, model_dir: Path, vocab_size: int) -> tuple[list[int], Any, str]:
    """Token ids for ``text``, the tokenizer and its description.

    The checkpoint's ``tokenizer.json`` when the folder has one, else the byte tokenizer.
    """
    spec = model_dir if (model_dir / "tokenizer.json").is_file() else "byte"
    tokenizer = load_tokenizer(spec)
    name = f"latentloop.data.tokenizers.{type(tokenizer).__name__}"
    ids = [int(i) for i in tokenizer.encode(text)]
    if ids and max(ids) >= vocab_size:
        raise UsageError(f"the prompt has token id {max(ids)}, beyond the model's vocab_size {vocab_size}")
    return ids, tokenizer, name


def load_model_and_prompt(
    args: argparse.Namespace,
) -> tuple[RecurrentDepthLM, torch.Tensor, dict[str, Any], Any]:
    """The model, the prompt [1, T0], a JSON description of both and the tokenizer (``None`` without one)."""
    need = args.prompt_len + args.new_tokens
    tokenizer = None
    if args.model is None:
        model = random_model(args, block_size=max(256, need))
        generator = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), generator=generator)
        info: dict[str, Any] = {
            "kind": "random",
            "note": "randomly initialised weights: adaptive-exit figures say nothing about a trained model",
            "prompt": {"kind": "random-ids", "tokens": args.prompt_len},
        }
    else:
        model = RecurrentDepthLM.from_pretrained(args.model)
        text = args.prompt if args.prompt is not None else "The recurrent-depth model thinks in latent space."
        token_list, tokenizer, tokenizer_name = encode_prompt(text, args.model, model.config.vocab_size)
        if not token_list:
            raise UsageError("the prompt encodes to no tokens")
        ids = torch.tensor([token_list], dtype=torch.long)
        info = {
            "kind": "checkpoint",
            "path": str(args.model.resolve()),
            "prompt": {"kind": "text", "text": text, "tokenizer": tokenizer_name, "tokens": len(token_list)},
        }
    total = ids.shape[1] + args.new_tokens
    if total > model.config.block_size:
        raise UsageError(
            f"prompt plus new tokens ({total}) exceed the model's block_size {model.config.block_size}"
        )
    model = model.to(args.device).eval()
    config = model.config
    info["config"] = {
        "n_embd": config.n_embd,
        "n_heads": config.n_heads,
        "layers": [config.n_layers_in_prelude, config.n_layers_in_recurrent_block, config.n_layers_in_coda],
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "block_size": config.block_size,
        "dtype": str(config_dtype(model)).replace("torch.", ""),
    }
    info["parameters"] = model.num_parameters()
    return model, ids.to(args.device), info, tokenizer


def config_dtype(model: RecurrentDepthLM) -> torch.dtype:
    """The model's parameter dtype."""
    return model.transformer.wte.weight.dtype


# Measurement helpers ----------------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    """Wait for queued GPU work so wall times are complete (no-op on CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(run: Callable[[], GenerationOutput], device: str, seed: int) -> tuple[GenerationOutput, float]:
    """Run ``run`` once with the RNG seeded (so random initial states repeat) and return it with its wall time."""
    torch.manual_seed(seed)
    synchronize(device)
    start = time.perf_counter()
    out = run()
    synchronize(device)
    return out, time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    """Median as a plain float."""
    return float(statistics.median(values))


def agreement(reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> dict[str, Any]:
    """How far ``other``'s new tokens match ``reference``'s: identical, fraction equal, first divergence."""
    a, b = reference[:, prompt_len:], other[:, prompt_len:]
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).reshape(-1)
    diverged = (~same).nonzero()
    return {
        "identical": bool(a.shape == b.shape and torch.equal(a, b)),
        "token_agreement": float(same.double().mean()) if n else 1.0,
        "first_divergence": int(diverged[0]) if diverged.numel() else None,
    }


# Sections ---------------------------------------------------------------------------------------------------


def interleaved(
    runs: dict[str, Any], args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Warm every variant up, then time them one after the other in each repeat: tokens/s per repeat and the
    last output of each variant."""
    for run in runs.values():  # warm-up (allocator, kernels)
        timed(run, args.device, args.seed)
    tps: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, GenerationOutput] = {}
    for _ in range(args.repeats):
        for name, run in runs.items():
            out, seconds = timed(run, args.device, args.seed)
            tps[name].append(out.new_tokens / seconds)
            outputs[name] = out
    return tps, outputs


def bench_throughput(
    model: RecurrentDepthLM, prompt: torch.Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    """Tokens/s at each fixed depth with the full cache, with KV sharing and without a cache."""
    variants: dict[str, dict[str, Any]] = {
        "cache": {},
        f"kv_share_{args.kv_share}": {"kv_share": args.kv_share},
        "no_cache": {"use_cache": False},
    }
    results: dict[str, Any] = {}
    for depth in args.depths:

        def runner(options: dict[str, Any], depth: int = depth) -> Callable[[], GenerationOutput]:
            return lambda: generate(
                model,
                prompt,
                max_new_tokens=args.new_tokens,
                num_steps=depth,
                init_scale=args.init_scale,
                **options,
            )

        runs = {name: runner(options) for name, options in variants.items()}
        tps, outputs = interleaved(runs, args)
        share = f"kv_share_{args.kv_share}"
        paired = {
            "cache_speedup_vs_no_cache": [c / n for c, n in zip(tps["cache"], tps["no_cache"], strict=True)],
            f"{share}_vs_cache": [s / c for s, c in zip(tps[share], tps["cache"], strict=True)],
        }
        results[f"r={depth}"] = {
            "tokens_per_second": {name: median(values) for name, values in tps.items()},
            "tokens_per_second_runs": tps,
            "ratios": {name: median(values) for name, values in paired.items()},
            "outputs_vs_cache": {
                name: agreement(outputs["cache"].sequences, out.sequences, prompt.shape[1])
                for name, out in outputs.items()
                if name != "cache"
            },
        }
    return results


def decode_with_cache(
    model: RecurrentDepthLM,
    prompt: torch.Tensor,
    depth: int,
    new_tokens: int,
    kv_share: int | None,
    init_scale: float,
) -> tuple[torch.Tensor, RecurrentKVCache]:
    """Greedy decoding through ``model(..., cache=cache)`` with a cache sized like ``generate``'s; returns the
    sequence and the cache so its memory can be inspected."""
    config = model.config
    cache = RecurrentKVCache(
        prompt.shape[0],
        config.n_heads,
        config.head_dim,
        prompt.shape[1] + new_tokens,
        kv_share,
        config_dtype(model),
        prompt.device,
    )
    sequence = prompt
    with torch.no_grad():
        logits = model(prompt, num_steps=depth, init_scale=init_scale, cache=cache).logits
        for step in range(new_tokens):
            token = logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
            if step < new_tokens - 1:
                logits = model(token, num_steps=depth, init_scale=init_scale, cache=cache).logits
    return sequence, cache


def bench_memory(model: RecurrentDepthLM, prompt: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """KV-cache bytes after decoding at ``--memory-depth`` with ``kv_share`` against no sharing."""
    depth, share = args.memory_depth, args.kv_share
    result: dict[str, Any] = {"depth": depth, "kv_share": share, "new_tokens": args.new_tokens}
    caches: dict[str, RecurrentKVCache] = {}
    for name, slots in (("no_sharing", None), (f"kv_share_{share}", share)):
        torch.manual_seed(args.seed)
        sequence, cache = decode_with_cache(model, prompt, depth, args.new_tokens, slots, args.init_scale)
        torch.manual_seed(args.seed)
        reference = generate(
            model,
            prompt,
            max_new_tokens=args.new_tokens,
            num_steps=depth,
            init_scale=args.init_scale,
            kv_share=slots,
        ).sequences
        caches[name] = cache
        result[name] = {
            "nbytes": cache.nbytes(),
            "core_slots": len(cache.core_slots()),
            "buffers": len(cache.keys),
            "positions_written": cache.length,
            "capacity": cache.capacity,
            # The loop above decodes exactly like generate(); this confirms the measured cache is the real one.
            "same_tokens_as_generate": bool(torch.equal(sequence, reference)),
        }
    full, shared = caches["no_sharing"].nbytes(), caches[f"kv_share_{share}"].nbytes()
    ratio = shared / full
    result["ratio"] = ratio
    result["target_ratio"] = MEMORY_TARGET
    result["meets_target"] = ratio <= MEMORY_TARGET
    return result


def bench_exit(
    model: RecurrentDepthLM, prompt: torch.Tensor, args: argparse.Namespace, tokenizer: Any = None
) -> dict[str, Any]:
    """Mean iterations, tokens/s and output identity of each exit criterion against fixed depth (with a
    tokenizer, the fixed-depth continuation is decoded to text too)."""
    depth = args.exit_depth

    def runner(spec: str | None) -> Callable[[], GenerationOutput]:
        return lambda: generate(
            model,
            prompt,
            max_new_tokens=args.new_tokens,
            num_steps=depth,
            init_scale=args.init_scale,
            exit=spec,
        )

    runs = {"fixed": runner(None), **{spec: runner(spec) for spec in args.criteria}}
    tps, outputs = interleaved(runs, args)
    fixed = outputs["fixed"]
    result: dict[str, Any] = {
        "max_depth": depth,
        "fixed_depth": {
            "tokens_per_second": median(tps["fixed"]),
            "mean_steps": float(fixed.steps.double().mean()),
            "new_token_ids": fixed.sequences[0, prompt.shape[1] :].tolist(),
        },
        "criteria": {},
    }
    for spec in args.criteria:
        out = outputs[spec]
        decoded = out.steps[:, 1:].double()  # the first new token comes from the full-depth prefill
        result["criteria"][spec] = {
            "mean_steps": float(out.steps.double().mean()),
            "mean_steps_decoded_tokens": float(decoded.mean()) if decoded.numel() else None,
            "tokens_per_second": median(tps[spec]),
            "speedup_vs_fixed": median([e / f for e, f in zip(tps[spec], tps["fixed"], strict=True)]),
            **agreement(fixed.sequences, out.sequences, prompt.shape[1]),
        }
    result["fixed_depth"]["text"] = tokenizer.decode(result["fixed_depth"]["new_token_ids"])
    return result


# Main -------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All requested sections as one JSON-ready mapping."""
    torch.set_num_threads(args.threads)
    model, prompt, info, tokenizer = load_model_and_prompt(args)
    report: dict[str, Any] = {
        "benchmark": "generation",
        "model": info,
        "settings": {
            "depths": args.depths,
            "new_tokens": args.new_tokens,
            "batch_size": 1,
            "greedy": True,
            "init_scale": args.init_scale,
            "repeats": args.repeats,
            "quick": args.quick,
            "seed": args.seed,
        },
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": args.device,
            "threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
    }
    started = time.perf_counter()
    if "throughput" not in args.skip:
        report["throughput"] = bench_throughput(model, prompt, args)
    if "memory" not in args.skip:
        report["kv_cache_memory"] = bench_memory(model, prompt, args)
    if "exit" not in args.skip:
        report["adaptive_exit"] = bench_exit(model, prompt, args, tokenizer)
    report["wall_seconds"] = time.perf_counter() - started
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Print the JSON report; exit status 2 with one line on bad input."""
    args = parse_args(argv)
    try:
        report = run(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    emit_json_report(report, args.output, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
