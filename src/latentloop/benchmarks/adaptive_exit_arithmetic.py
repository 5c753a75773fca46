"""Adaptive exit on a trained arithmetic model: held-out accuracy, agreement with fixed depth, mean core
iterations per token and tokens/s for each exit criterion, all measured side by side in one run.

    .venv/bin/python benchmarks/adaptive_exit_arithmetic.py runs/lm-arithmetic --depth 32 --problems 200

Every problem is decoded greedily, one sequence at a time (batch 1, so an early exit really saves compute),
from a zero initial state. Prints one JSON object.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from latentloop.errors import ArgumentParser, UsageError
from latentloop.models.generation import EXIT_CRITERIA, generate
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.tasks.base import get_task
from latentloop.train.checkpoint import resolve_checkpoint, run_folder_of
from latentloop.train.run_config import load_run_config


def decode_all(model, task, problems, depth: int, exit_spec: str | None) -> dict:
    """Greedy answers for ``problems`` with per-problem timing and iteration counts."""
    answers, steps, seconds, tokens = [], [], 0.0, 0
    for problem in problems:
        prompt = torch.tensor([task.encode(task.prompt(problem))])
        width = len(task.answer(problem)) + 1
        started = time.perf_counter()
        out = generate(model, prompt, max_new_tokens=width, num_steps=depth, init_scale=0.0, exit=exit_spec)
        seconds += time.perf_counter() - started
        new = out.sequences[0, prompt.shape[1] :].tolist()
        answers.append(task.decode(new))
        steps.extend(out.steps[0].tolist())
        tokens += len(new)
    correct = sum(task.verify(p, a) for p, a in zip(problems, answers, strict=True))
    return {
        "answers": answers,
        "accuracy": correct / len(problems),
        "mean_iterations_per_token": statistics.fmean(steps),
        "tokens_per_second": tokens / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run folder or checkpoint of an arithmetic recurrent-depth model")
    parser.add_argument("--depth", type=int, default=32, help="maximum (and fixed) core iterations per token")
    parser.add_argument("--problems", type=int, default=200, help="held-out problems to decode")
    parser.add_argument("--criteria", default=",".join(EXIT_CRITERIA), help="comma-separated exit specs")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: latency-bound batch-1 decoding)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        checkpoint = resolve_checkpoint(args.run)
        run = run_folder_of(checkpoint)
        if run is None:
            raise UsageError(f"{checkpoint} is not inside a run folder, so its task is unknown")
        config = load_run_config(run / "config.yaml", [])
        task = get_task(config.task.name, **config.task.options)
        model = RecurrentDepthLM.from_pretrained(checkpoint)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    problems = task.test_problems()[: args.problems]
    fixed = decode_all(model, task, problems, args.depth, None)
    report = {
        "checkpoint": str(checkpoint),
        "task": {"name": config.task.name, **config.task.options},
        "depth": args.depth,
        "problems": len(problems),
        "fixed_depth": {k: v for k, v in fixed.items() if k != "answers"},
        "criteria": {},
    }
    for spec in filter(None, args.criteria.split(",")):
        result = decode_all(model, task, problems, args.depth, spec)
        same = sum(a == b for a, b in zip(result.pop("answers"), fixed["answers"], strict=True))
        result["same_output_as_fixed_depth"] = same / len(problems)
        result["iterations_saved"] = (
            1 - result["mean_iterations_per_token"] / fixed["mean_iterations_per_token"]
        )
        result["speedup_vs_fixed_depth"] = result["tokens_per_second"] / fixed["tokens_per_second"]
        report["criteria"][spec] = result
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
