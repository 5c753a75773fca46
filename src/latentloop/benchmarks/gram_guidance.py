"""GRAM's prior against its posterior on a trained run: how far the prior carries an answer the posterior began.

    latentloop bench gram_guidance RUN [--limit 200] [--steps N] [--seed 0] [--output FILE]

For each k in 0..N (N supervision steps), the first k steps draw their noise from the posterior, which sees
the target, and the remaining steps from the prior. k = 0 is plain inference; k = N is what training decodes.
The fraction of test puzzles whose decoded answer the task's verifier accepts, for every k, shows where the
prior fails: at choosing an answer (k = 0 low, k = 1 high) or at carrying one through (a slow climb with k).
Along the posterior trajectory it also reports KL(q || p) per step (nats per puzzle) and the exact match of the
decoded answer with the target. One row per distinct test input, with the first of its targets. Prints one
JSON object.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from latentloop.data.labels import scored_labels
from latentloop.errors import ArgumentParser, UsageError
from latentloop.eval.reasoners import decode_answer, unique_rows
from latentloop.infer.runs import load_run, run_dataset
from latentloop.io import emit_json_report


def guided_validity(model, task, inputs: torch.Tensor, targets: torch.Tensor, steps: int, k: int) -> float:
    """Fraction of puzzles solved when the first ``k`` of ``steps`` supervision steps use the posterior."""
    batch = {"inputs": inputs}
    carry = model.initial_carry(batch)
    for n in range(steps):
        carry, out = model(carry, batch, target=targets if n < k else None)
    answers = out.logits.argmax(-1).numpy()
    puzzles = [task.decode(x) for x in inputs.numpy()]
    return float(
        np.mean([task.verify(p, decode_answer(task, a)) for p, a in zip(puzzles, answers, strict=True)])
    )


def posterior_trajectory(model, inputs: torch.Tensor, targets: torch.Tensor, steps: int) -> dict[str, list]:
    """KL(q || p) (mean nats per puzzle) and exact match with the target after each posterior step."""
    batch = {"inputs": inputs}
    carry = model.initial_carry(batch)
    kl, exact = [], []
    for _ in range(steps):
        carry, out = model(carry, batch, target=targets)
        kl.append(round(float(out.kl.mean()), 3))
        exact.append(round(float((out.logits.argmax(-1) == targets).all(-1).float().mean()), 4))
    return {"kl_per_step": kl, "exact_per_step": exact}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a GRAM run folder or checkpoint")
    parser.add_argument("--limit", type=int, default=200, help="distinct test inputs")
    parser.add_argument(
        "--steps", type=int, default=None, help="supervision steps (default: the model's n_sup)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the noise")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        model, task, checkpoint, folder = load_run(args.run)
        if model.arch != "gram":
            raise UsageError(f"{args.run}: a GRAM run is needed (this one is {model.arch})")
        split = run_dataset(args.run, folder).split("test")
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = unique_rows(split, args.limit)
    inputs = torch.from_numpy(np.asarray(split["inputs"])[rows].astype(np.int64))
    targets = torch.from_numpy(scored_labels(np.asarray(split["labels"])[rows]))
    steps = args.steps or model.config.n_sup
    torch.manual_seed(args.seed)
    with torch.no_grad():
        report = {
            "run": args.run,
            "checkpoint": str(checkpoint),
            "task": task.name,
            "puzzles": len(rows),
            "steps": steps,
            "seed": args.seed,
            "posterior": posterior_trajectory(model, inputs, targets, steps),
            "valid_by_posterior_steps": {
                str(k): round(guided_validity(model, task, inputs, targets, steps, k), 4)
                for k in range(steps + 1)
            },
        }
    emit_json_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
