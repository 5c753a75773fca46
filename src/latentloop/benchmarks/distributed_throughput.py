"""Data-parallel training throughput: the same recurrent-depth run with 1 process and with N processes
(``torchrun --standalone -m latentloop train``, gloo on CPU), measured in one invocation.

    nice -n 10 .venv/bin/python benchmarks/distributed_throughput.py --output benchmarks/results/distributed_throughput.json

Every process count trains the same config (same seed, same global batch) for ``--steps`` steps, ``--repeats``
times, alternating the process counts inside each repeat so a slow moment on a shared machine hits both. Each
launch gets ``--threads`` torch threads in all (split evenly over its processes), so the comparison is the
same CPU budget spent two ways. Reported: median tokens/s over the steps after ``--warmup`` (from rank 0's
``metrics.jsonl``, global tokens), the median per-repeat ratio N-process / 1-process, and the largest
difference between the two runs' per-step losses (which should be float rounding only). On a 2-core machine
this shows correctness and overhead, not speed-up.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from latentloop.errors import ArgumentParser
from latentloop.io import emit_json_report

CONFIG = {
    "model": {
        "n_embd": 128,
        "n_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 264,
        "block_size": 32,
        "mean_recurrence": 4,
        "mean_backprop_depth": 2,
        "sampling_scheme": "fixed",
    },
    "train": {
        "lr": 1e-3,
        "warmup_steps": 5,
        "batch_size": 64,
        "precision": "fp32",
        "device": "cpu",
        "log_every": 1,
        "eval_every": 0,
        "eval_size": 0,
        "checkpoint_every": 0,
        "tensorboard": False,
    },
    "task": {"name": "arithmetic", "digits": 3},
}


def launch(folder: Path, processes: int, steps: int, threads: int) -> dict[int, dict]:
    """Train once with ``processes`` ranks; rank 0's train records by step."""
    out = folder / f"run-{processes}-{time.monotonic_ns()}"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(threads // processes, 1))}
    command = [
        torchrun,
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "latentloop",
        "train",
        "--config",
        str(folder / "config.yaml"),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "-q",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"error: {processes}-process run failed: {done.stderr.strip().splitlines()[-1:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if r["kind"] == "train"}


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    counts = (1, args.processes)
    speeds: dict[int, list[float]] = {n: [] for n in counts}
    ratios, loss_gaps, tokens_per_step = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        for _ in range(args.repeats):
            runs = {n: launch(folder, n, args.steps, args.threads) for n in counts}
            medians = {}
            for n, records in runs.items():
                rates = [records[s]["tokens_per_s"] for s in sorted(records) if s > args.warmup]
                medians[n] = statistics.median(rates)
                speeds[n].append(medians[n])
            ratios.append(medians[args.processes] / medians[1])
            tokens_per_step = runs[1][1]["tokens_seen"]
            loss_gaps.append(max(abs(runs[1][s]["loss"] - runs[args.processes][s]["loss"]) for s in runs[1]))
    result = {
        "benchmark": "distributed_throughput",
        "config": CONFIG,
        "steps": args.steps,
        "warmup_steps_excluded": args.warmup,
        "repeats": args.repeats,
        "threads_in_all": args.threads,
        "cpu_count": os.cpu_count(),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": {f"{n}_process": round(statistics.median(speeds[n]), 1) for n in counts},
        "tokens_per_s_per_repeat": {f"{n}_process": [round(v, 1) for v in speeds[n]] for n in counts},
        f"ratio_{args.processes}_over_1": round(statistics.median(ratios), 3),
        "max_loss_difference": max(loss_gaps),
    }
    emit_json_report(result, args.output)


if __name__ == "__main__":
    main()
