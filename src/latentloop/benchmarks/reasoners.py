"""Reasoner benchmarks on N-Queens 8x8: training throughput of every model and batched against sequential sampling.

Prints one JSON object (``--output FILE`` also writes it). Models are randomly initialised (seed 0, no training):
both figures depend on the sizes and the work per step, not on the weights.

- **train**: training examples/s of each model in the registry with the sizes of ``configs/nqueens8-<model>.yaml``
  (a model without its own config takes the sizes of ``nqueens8-direct.yaml``, the single-stack transformer, and
  the JSON says so). One batch is what ``train_reasoner`` does per step: the batch drawn and augmented as in
  training, then ``n_sup`` supervision steps, each a forward, the loss, a backward, gradient clipping, an AdamW
  step and the EMA update. The models take turns inside each repeat (``A B C .. A B C ..``), after ``--warmup``
  untimed batches each, so a slow moment on the shared machine hits all of them; each figure is the median over
  repeats. Parameter counts are reported, with the largest/smallest ratio (the configs keep it within 20%).
- **compile**: for the ``--compile-models``, the same training batch with eager kernels against
  ``train.compile`` (every block compiled, :func:`latentloop.nn.compile_blocks`), timed alternately after a
  warm-up batch that pays the compilation (reported as ``first_batch_s``). Reports both medians and the median
  of the per-repeat ratios eager / compiled.
- **sampling**: for GRAM and TRM, ``solve(model, x, samples=K)`` (the K samples of every puzzle as one batch)
  against K sequential ``solve(model, x, samples=1)`` calls on the same puzzles, timed alternately
  (``batched, sequential, batched, ..``). Reports both medians and the median of the per-repeat ratios
  sequential / batched. TRM is deterministic, so ``solve`` runs one trajectory for its K equal samples: its
  ratio measures that saving, GRAM's the batching of K different trajectories.

Usage: ``python benchmarks/reasoners.py [--repeats 5] [--warmup 1] [--batch-size 16] [--puzzles 1]
[--samples 20] [--models direct,gram] [--compile-models gram,trm] [--skip train,compile,sampling] [--threads 1]
[--output benchmarks/results/reasoners.json]``.
"""

from __future__ import annotations

import copy
import platform
import statistics
import time
from itertools import islice
from typing import Any

import numpy as np
import torch

from latentloop.config import load_yaml
from latentloop.errors import ArgumentParser
from latentloop.infer.scaling import solve
from latentloop.io import emit_json_report
from latentloop.models.reasoners import REASONERS, Reasoner, build_reasoner, num_parameters
from latentloop.nn import compile_blocks
from latentloop.paths import CONFIGS_DIR, shipped_or_relative
from latentloop.tasks.base import Task, get_task
from latentloop.train.deep_supervision import next_step_continue_target, supervision_loss
from latentloop.train.optim import build_optimizer
from latentloop.train.puzzle_batches import train_batch
from latentloop.train.run_config import ReasonerRunConfig, build_reasoner_config, fit_to_task


def run_config(arch: str) -> tuple[ReasonerRunConfig, str]:
    """The run config of ``arch`` on N-Queens 8x8 and the file its sizes come from."""
    path = CONFIGS_DIR / f"nqueens8-{arch}.yaml"
    source = path if path.is_file() else CONFIGS_DIR / "nqueens8-direct.yaml"
    config = build_reasoner_config(load_yaml(source), arch=arch)
    return config, shipped_or_relative(source)


def puzzle_split(task: Task, size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``size`` training pairs of ``task`` as token arrays (what ``train_batch`` draws from)."""
    pairs = list(islice(task.examples("train", seed), size))
    return {
        "inputs": np.stack([task.encode(p) for p, _ in pairs]),
        "labels": np.stack([task.encode(s) for _, s in pairs]),
        "puzzle_ids": np.zeros(len(pairs), dtype=np.int64),  # N-Queens has no per-puzzle embeddings
    }


class BatchTrainer:
    """One model with its optimizer and EMA copy; :meth:`batch` runs one training batch as ``train_reasoner``."""

    def __init__(
        self,
        config: ReasonerRunConfig,
        task: Task,
        split: dict[str, np.ndarray],
        seed: int,
        compiled: bool = False,
    ) -> None:
        torch.manual_seed(seed)
        self.config, self.task, self.split, self.seed = config, task, split, seed
        self.model = build_reasoner(config.arch, fit_to_task(config.model, task)).train()
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        if compiled:  # as train.compile does: after the EMA copy, which stays eager
            compile_blocks(self.model)
        tc = config.train
        self.optimizer = build_optimizer(self.model, tc.lr, tc.betas, tc.weight_decay, tc.eps)
        self.params, self.ema_params = list(self.model.parameters()), list(self.ema.parameters())
        self.step = 0

    def batch(self, batch_size: int) -> None:
        """``n_sup`` supervision steps on the next batch, each with backward, clipping, AdamW and EMA."""
        model, tc, n_sup = self.model, self.config.train, self.config.model.n_sup
        inputs, labels, _ = train_batch(self.task, self.split, self.step, batch_size, self.seed, tc.augment)
        batch = {"inputs": inputs}
        carry = model.initial_carry(batch)
        for n in range(n_sup):
            carry, out = model(carry, batch, target=labels)
            target_q = None
            if self.config.model.halting == "q-learning":
                target_q = next_step_continue_target(model, carry, batch, labels, n == n_sup - 1)
            loss, _ = supervision_loss(out, labels, self.config.model.beta, tc, target_q)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, tc.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                torch._foreach_lerp_(self.ema_params, self.params, 1.0 - tc.ema)
            carry = {k: v.detach() for k, v in carry.items()}
        self.step += 1


def bench_training(
    archs: list[str], task: Task, batch_size: int, warmup: int, repeats: int, seed: int
) -> dict[str, Any]:
    split = puzzle_split(task, 512, seed)
    trainers, sources = {}, {}
    for arch in archs:
        config, sources[arch] = run_config(arch)
        trainers[arch] = BatchTrainer(config, task, split, seed)
    for _ in range(warmup):
        for trainer in trainers.values():
            trainer.batch(batch_size)
    times: dict[str, list[float]] = {arch: [] for arch in archs}
    for _ in range(repeats):
        for arch, trainer in trainers.items():  # the models take turns: machine noise hits all of them
            start = time.perf_counter()
            trainer.batch(batch_size)
            times[arch].append(time.perf_counter() - start)
    params = {arch: num_parameters(t.model) for arch, t in trainers.items()}
    models = {}
    for arch, trainer in trainers.items():
        median = statistics.median(times[arch])
        c = trainer.config.model
        models[arch] = {
            "config": sources[arch],
            "parameters": params[arch],
            "sizes": {"dim": c.dim, "n_layers": c.n_layers, "hidden": c.hidden, "n_sup": c.n_sup},
            "recursion": {"cycles": c.cycles, "inner": c.inner},
            "batch_time_s": round(median, 4),
            "examples_per_s": round(batch_size / median, 2),
            "optimizer_steps_per_s": round(c.n_sup / median, 2),
            "batch_times_s": [round(t, 4) for t in times[arch]],
        }
    return {
        "batch_size": batch_size,
        "warmup_batches": warmup,
        "repeats": repeats,
        "precision": "fp32",
        "parameter_ratio_max_over_min": round(max(params.values()) / min(params.values()), 3),
        "models": models,
    }


MODES = ("eager", "compiled")


def bench_compile(archs: list[str], task: Task, batch_size: int, repeats: int, seed: int) -> dict[str, Any]:
    split = puzzle_split(task, 512, seed)
    results = {}
    for arch in archs:
        config, source = run_config(arch)
        runs = {mode: BatchTrainer(config, task, split, seed, compiled=mode == "compiled") for mode in MODES}
        first = {}
        for mode, trainer in runs.items():
            start = time.perf_counter()
            trainer.batch(batch_size)
            first[mode] = time.perf_counter() - start
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(repeats):
            for mode, trainer in runs.items():  # alternately: machine noise hits both
                start = time.perf_counter()
                trainer.batch(batch_size)
                times[mode].append(time.perf_counter() - start)
        ratios = [e / c for e, c in zip(times["eager"], times["compiled"], strict=True)]
        results[arch] = {
            "config": source,
            "first_batch_s": {mode: round(t, 2) for mode, t in first.items()},
            "eager_batch_s": round(statistics.median(times["eager"]), 4),
            "compiled_batch_s": round(statistics.median(times["compiled"]), 4),
            "speedup_compiled": round(statistics.median(ratios), 3),
        }
    return {"batch_size": batch_size, "repeats": repeats, "models": results}


def bench_sampling(
    arch: str, task: Task, puzzles: int, samples: int, repeats: int, seed: int
) -> dict[str, Any]:
    config, source = run_config(arch)
    torch.manual_seed(seed)
    model: Reasoner = build_reasoner(arch, fit_to_task(config.model, task)).eval()
    x = torch.from_numpy(puzzle_split(task, puzzles, seed)["inputs"].astype(np.int64))

    def batched() -> None:
        solve(model, x, samples=samples)

    def sequential() -> None:
        for _ in range(samples):
            solve(model, x, samples=1)

    batched(), sequential()  # warm-up
    times: dict[str, list[float]] = {"batched": [], "sequential": []}
    for _ in range(repeats):
        for name, fn in (("batched", batched), ("sequential", sequential)):  # ABAB: noise hits both
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ratios = [s / b for s, b in zip(times["sequential"], times["batched"], strict=True)]
    return {
        "config": source,
        "parameters": num_parameters(model),
        "puzzles": puzzles,
        "samples": samples,
        "steps": config.model.n_sup,
        "batched_s": round(statistics.median(times["batched"]), 4),
        "sequential_s": round(statistics.median(times["sequential"]), 4),
        "speedup_batched": round(statistics.median(ratios), 3),
        "meets_target_4x": statistics.median(ratios) >= 4,
        "batched_times_s": [round(t, 4) for t in times["batched"]],
        "sequential_times_s": [round(t, 4) for t in times["sequential"]],
    }


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(REASONERS), help="comma-separated (default: all)")
    parser.add_argument("--batch-size", type=int, default=16, help="training batch (the configs use 64)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed training batches per model")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--puzzles", type=int, default=1, help="puzzles per solve call")
    parser.add_argument("--samples", type=int, default=20, help="K: samples per puzzle")
    parser.add_argument("--sampling-models", default="gram,trm")
    parser.add_argument("--compile-models", default="gram,trm")
    parser.add_argument("--skip", default="", help="any of train, compile, sampling (comma-separated)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    task = get_task("nqueens", n=8)
    skip = set(filter(None, args.skip.split(",")))
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "task": "nqueens n=8",
    }
    if "train" not in skip:
        archs = [a for a in args.models.split(",") if a]
        report["train"] = bench_training(archs, task, args.batch_size, args.warmup, args.repeats, args.seed)
    if "compile" not in skip:
        archs = [a for a in args.compile_models.split(",") if a]
        report["compile"] = bench_compile(archs, task, args.batch_size, args.repeats, args.seed)
    if "sampling" not in skip:
        report["sampling"] = {
            arch: bench_sampling(arch, task, args.puzzles, args.samples, args.repeats, args.seed)
            for arch in args.sampling_models.split(",")
            if arch
        }
    emit_json_report(report, args.output)


if __name__ == "__main__":
    main()
