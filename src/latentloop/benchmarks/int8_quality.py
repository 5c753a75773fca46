"""What int8 weights cost a trained looped LM: greedy tokens, held-out metric and logit drift at each depth.

    latentloop bench int8_quality --model RUN [--depths 1,2,4,8,16,32] [--limit 200] [--tokens 16]
                                  [--threads 2] [--output FILE]

The run's model in fp32 and with its linear and embedding weights int8 (:func:`latentloop.nn.quantized.
quantize_weights`; eager decoding, so the int8 kernel's bf16 rows are in the comparison), at each depth on the
task's held-out split (the first ``--limit`` problems or windows):

- the task's metric of both (exact match of the answer, or perplexity);
- teacher-forced greedy agreement: the share of scored positions where both pick the same token;
- the drift of the logits: the mean KL divergence from fp32's next-token distribution to int8's (nats) and the
  largest absolute logit difference, since the error of each loop step feeds the next;
- free-running agreement: the share of ``--tokens`` greedy tokens generated from the first 16 held-out
  prompts that are the same.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import ArgumentParser, whole_number
from latentloop.eval.lm import evaluation_task
from latentloop.eval.metrics import heldout_metric
from latentloop.io import emit_json_report
from latentloop.models.generation import generate
from latentloop.models.looped_lms import load_looped_lm
from latentloop.nn.quantized import quantize_weights
from latentloop.runtime import cpu_description
from latentloop.train.checkpoint import resolve_checkpoint

PROMPTS = 16


def drift(
    fp32: torch.nn.Module, int8: torch.nn.Module, task: Any, depth: int, limit: int
) -> dict[str, float]:
    """Teacher-forced agreement and logit drift over the held-out batches' scored positions."""
    same = positions = 0
    kl_sum, largest = 0.0, 0.0
    for inputs, labels, _ in task.heldout_batches(64, limit):
        a = fp32(inputs, num_steps=depth, init_scale=0.0).logits.float()
        b = int8(inputs, num_steps=depth, init_scale=0.0).logits.float()
        scored = labels != IGNORE_LABEL
        a, b = a[scored], b[scored]
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        positions += a.shape[0]
        kl = torch.nn.functional.kl_div(
            b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="sum"
        )
        kl_sum += float(kl)
        largest = max(largest, float((a - b).abs().max()))
    return {
        "greedy_agreement": round(same / positions, 5),
        "positions": positions,
        "mean_kl_nats": round(kl_sum / positions, 6),
        "max_abs_logit_difference": round(largest, 4),
    }


def free_running(fp32: torch.nn.Module, int8: torch.nn.Module, task: Any, depth: int, tokens: int) -> float:
    """The share of greedy tokens, generated from the first held-out prompts, that int8 and fp32 share."""
    inputs, labels, _ = next(iter(task.heldout_batches(PROMPTS, PROMPTS)))
    same = total = 0
    for row, label in zip(inputs, labels, strict=True):
        scored = (label != IGNORE_LABEL).nonzero()
        cut = (
            int(scored[0]) + 1 if len(scored) else max(1, len(row) // 2)
        )  # the prompt: up to the first scored
        prompt = row[:cut].unsqueeze(0)
        outs = [
            generate(m, prompt, max_new_tokens=tokens, num_steps=depth, init_scale=0.0).sequences[0, cut:]
            for m in (fp32, int8)
        ]
        same += int((outs[0] == outs[1]).sum())
        total += outs[0].numel()
    return round(same / total, 5)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a run folder or a checkpoint folder")
    parser.add_argument("--depths", default="1,2,4,8,16,32", help="depths, comma-separated")
    parser.add_argument("--limit", type=whole_number(1), default=200, help="held-out problems or windows")
    parser.add_argument("--tokens", type=whole_number(1), default=16, help="free-running greedy tokens")
    parser.add_argument("--threads", type=whole_number(1), default=2, help="torch threads")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        parser.error("--depths takes whole numbers, comma-separated")
    if min(depths) < 1:
        parser.error("--depths must be at least 1")
    torch.set_num_threads(args.threads)
    checkpoint = resolve_checkpoint(args.model)
    task, task_info = evaluation_task(checkpoint, None)
    fp32 = load_looped_lm(checkpoint)
    int8 = quantize_weights(fp32).eval()
    rows = []
    with torch.inference_mode():
        for depth in depths:
            metric = {
                name: heldout_metric(model, task, depth, limit=args.limit)
                for name, model in (("fp32", fp32), ("int8", int8))
            }
            rows.append(
                {
                    "depth": depth,
                    **{f"{name}_{key}": value for name, got in metric.items() for key, value in got.items()},
                    **drift(fp32, int8, task, depth, args.limit),
                    "free_running_agreement": free_running(fp32, int8, task, depth, args.tokens),
                }
            )
    report = {
        "benchmark": "int8_quality",
        "environment": {"cpu": cpu_description(), "torch": torch.__version__, "threads": args.threads},
        "checkpoint": str(checkpoint),
        "task": task_info,
        "metric": task.metric,
        "limit": args.limit,
        "free_running_tokens": args.tokens,
        "rows": rows,
    }
    emit_json_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
