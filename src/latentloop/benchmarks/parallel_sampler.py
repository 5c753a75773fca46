"""The parallel (diffusion-style) sampler against sequential greedy decoding: tokens/s and token agreement.

For every prompt, sequential greedy decoding (``kv_share=1``, the cache the parallel sampler keeps) and the
parallel sampler under each setting run one after the other at the same depth, so a slow moment of a shared
machine hits both; the speed-up is the median of the per-prompt ratios. Agreement is the share of the
sequential output's positions where the parallel output has the same token; ``exact`` the share of prompts
whose outputs are identical. ``limit`` settings (wavefront 1, inner steps = depth, freeze by steps) must agree
exactly: the JSON says whether they did.

Prompts come from a run's task (its held-out problems, or for a text run the first ``--prompt-tokens`` tokens
of its held-out windows; ``--prompts N``) or from ``--prompt`` text. Without ``--model`` a small random model
is used, which says nothing about a trained one (the JSON names the model). The default sequential
``generate`` (a cache slot per iteration) is timed too, as ``speedup_vs_default``, and so is sequential
decoding that stops each token's iterations by the same ``latent-diff:0.03`` criterion
(``sequential_latent_diff``), the saving the freeze criterion would give without the wavefront.
Usage::

    python benchmarks/parallel_sampler.py --quick
    python benchmarks/parallel_sampler.py --model runs/lm-text --num-steps 32 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch

from latentloop.data.tokenizers import load_tokenizer
from latentloop.errors import ArgumentParser, UsageError
from latentloop.eval.lm import evaluation_task
from latentloop.io import emit_json_report
from latentloop.models.generation import generate
from latentloop.models.parallel_sampler import ParallelSampler
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.train.checkpoint import resolve_checkpoint

EARLY_EXIT = "latent-diff:0.03"
EXAMPLES = 2  # prompts whose token ids and sequential continuation the JSON keeps
SETTINGS = {
    "limit": {"wavefront": 1, "inner_steps": None, "freeze": "steps"},
    "wave32-steps": {"wavefront": 32, "inner_steps": 4, "freeze": "steps"},
    "wave32-latent-diff": {"wavefront": 32, "inner_steps": 4, "freeze": "latent-diff:0.03"},
    "wave32-latent-diff-0.01": {"wavefront": 32, "inner_steps": 4, "freeze": "latent-diff:0.01"},
    "wave8-latent-diff": {"wavefront": 8, "inner_steps": 4, "freeze": "latent-diff:0.03"},
}


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> float:
    """The share of ``reference``'s positions where ``tokens`` holds the same token."""
    same = tokens[: len(reference)] == reference[: len(tokens)]
    return float(same.float().sum()) / len(reference)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="run folder or checkpoint (default: a small random model)")
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable); default: the run's task")
    parser.add_argument(
        "--prompts", type=int, default=8, help="held-out problems of the run's task as prompts"
    )
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length for a text run")
    parser.add_argument("--num-steps", type=int, default=32, help="core iterations per token")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="two prompts, 8 tokens, depth 8 (a smoke run)")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.num_steps = 2, 8, 8
    for name in ("prompts", "prompt_tokens", "num_steps", "max_new_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def load_model_and_prompts(args: argparse.Namespace) -> tuple[RecurrentDepthLM, list[list[int]], str]:
    """The model, the prompts' token ids and a description of the model."""
    if args.model is None:
        torch.manual_seed(0)
        config = RecurrentDepthConfig(
            n_embd=256, n_heads=4, n_layers_in_prelude=1, n_layers_in_recurrent_block=2, n_layers_in_coda=1,
            intermediate_size=704, vocab_size=264, block_size=256, mean_recurrence=8,
        )  # fmt: skip
        model = RecurrentDepthLM(config).eval()
        prompts = [
            [int(t) for t in torch.randint(1, 256, (16,), generator=torch.Generator().manual_seed(i))]
            for i in range(args.prompts)
        ]
        return model, prompts, "random (h=256, layers 1/2/1)"
    checkpoint = resolve_checkpoint(args.model)
    model = RecurrentDepthLM.from_pretrained(checkpoint).eval()
    if args.prompt:
        tokenizer = load_tokenizer(None)
        return model, [tokenizer.encode(p) for p in args.prompt], str(checkpoint)
    task, _ = evaluation_task(checkpoint, None)
    if task.metric == "perplexity":  # a text run: the opening tokens of its held-out windows
        windows = next(iter(task.heldout_batches(args.prompts, args.prompts)))[0]
        return model, [row[: args.prompt_tokens].tolist() for row in windows], str(checkpoint)
    problems = task.test_problems()[: args.prompts]
    return model, [task.encode(p) for p in problems], str(checkpoint)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, prompts, description = load_model_and_prompts(args)
    depth, new = args.num_steps, args.max_new_tokens
    rows: dict[str, dict[str, list[float]]] = {
        name: {"ratio": [], "default_ratio": [], "agree": [], "exact": []} for name in SETTINGS
    }
    sequential_rates, default_rates = [], []
    early_rows: dict[str, list[float]] = {"ratio": [], "agree": []}
    examples = []
    for ids in prompts:
        prompt = torch.tensor([ids])
        base = generate(model, prompt, max_new_tokens=new, num_steps=depth, init_scale=0.0, kv_share=1)
        default = generate(model, prompt, max_new_tokens=new, num_steps=depth, init_scale=0.0)
        sequential_rates.append(base.tokens_per_second)
        default_rates.append(default.tokens_per_second)
        reference = base.sequences[0, len(ids) :]
        if len(examples) < EXAMPLES:
            examples.append({"prompt": ids, "sequential": reference.tolist()})
        early = generate(
            model, prompt, max_new_tokens=new, num_steps=depth, init_scale=0.0, kv_share=1, exit=EARLY_EXIT
        )
        early_rows["ratio"].append(early.tokens_per_second / base.tokens_per_second)
        early_rows["agree"].append(agreement(early.sequences[0, len(ids) :], reference))
        for name, setting in SETTINGS.items():
            sampler = ParallelSampler(**{**setting, "inner_steps": setting["inner_steps"] or depth})
            out = generate(
                model, prompt, max_new_tokens=new, num_steps=depth, init_scale=0.0, sampler=sampler
            )
            tokens = out.sequences[0, len(ids) :]
            rows[name]["ratio"].append(out.tokens_per_second / base.tokens_per_second)
            rows[name]["default_ratio"].append(out.tokens_per_second / default.tokens_per_second)
            rows[name]["agree"].append(agreement(tokens, reference))
            rows[name]["exact"].append(float(torch.equal(tokens, reference)))
    return {
        "benchmark": "parallel_sampler",
        "model": description,
        "num_steps": depth,
        "max_new_tokens": new,
        "prompts": len(prompts),
        "threads": args.threads,
        "sequential_tokens_per_second_median": statistics.median(sequential_rates),
        "default_tokens_per_second_median": statistics.median(default_rates),
        "sequential_latent_diff": {
            "exit": EARLY_EXIT,
            "speedup_median": statistics.median(early_rows["ratio"]),
            "token_agreement": statistics.fmean(early_rows["agree"]),
        },
        "settings": {
            name: {
                **SETTINGS[name],
                "inner_steps": SETTINGS[name]["inner_steps"] or depth,
                "speedup_median": statistics.median(row["ratio"]),
                "speedup_vs_default": statistics.median(row["default_ratio"]),
                "token_agreement": statistics.fmean(row["agree"]),
                "exact_share": statistics.fmean(row["exact"]),
            }
            for name, row in rows.items()
        },
        "examples": examples,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    emit_json_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
