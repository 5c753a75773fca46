"""Sampling speed of the generative reasoners on N-Queens 8x8: AR, MDLM at several unmasking steps, and GRAM.

Prints one JSON object (``--output FILE`` also writes it). Models are randomly initialised (seed 0, no
training) at the sizes of ``configs/nqueens8-{ar,mdlm,gram}.yaml``, whose parameter counts agree within 20%
(the JSON reports each count and ``parameter_ratio_max_over_min``): the time to draw a sample depends on the
sizes and the work per sample, not on the weights.

Each variant draws K samples of one puzzle in one batch, ``solve(model, x, samples=K)``, exactly as
``latentloop eval`` and ``latentloop sample`` do: AR decodes left to right with its KV cache (one pass), MDLM
runs ``--mdlm-steps`` unmasking steps (each a full forward of its denoiser), GRAM runs ``n_sup`` supervision
steps of T transitions of K_inner low-level updates (``--gram-steps`` to change ``n_sup``). The variants take
turns inside each repeat (``A B C .. A B C ..``), after ``--warmup`` untimed rounds, so a slow moment on a
shared machine hits all of them; each figure is the median over repeats, and ``relative_to_gram`` is the
median of the per-repeat ratios of GRAM's time to the variant's (above 1: faster than GRAM).

Usage: ``python benchmarks/sampling.py [--samples 64] [--repeats 5] [--warmup 1] [--mdlm-steps 4,8,16,32]
[--gram-steps N] [--threads 1] [--quick] [--output benchmarks/results/sampling.json]``.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any

import numpy as np
import torch

from latentloop.config import load_yaml
from latentloop.errors import ArgumentParser
from latentloop.infer.scaling import solve
from latentloop.io import emit_json_report
from latentloop.models.reasoners import Reasoner, build_reasoner, num_parameters
from latentloop.paths import CONFIGS_DIR, shipped_or_relative
from latentloop.tasks.base import Task, get_task
from latentloop.train.run_config import build_reasoner_config, fit_to_task

ARCHS = ("ar", "mdlm", "gram")


def build_model(arch: str, task: Task, seed: int) -> tuple[Reasoner, str]:
    """The untrained model of ``configs/nqueens8-<arch>.yaml`` (seeded) and that file's path."""
    path = CONFIGS_DIR / f"nqueens8-{arch}.yaml"
    config = build_reasoner_config(load_yaml(path), arch=arch)
    torch.manual_seed(seed)
    model = build_reasoner(arch, fit_to_task(config.model, task)).eval()
    return model, shipped_or_relative(path)


def variants(models: dict[str, Reasoner], mdlm_steps: list[int], gram_steps: int | None) -> dict[str, dict]:
    """``name -> {"arch", "steps"}`` of every timed variant (``steps`` as :func:`solve` takes it)."""
    found: dict[str, dict] = {"ar": {"arch": "ar", "steps": None}}
    for steps in mdlm_steps:
        found[f"mdlm@{steps}"] = {"arch": "mdlm", "steps": steps}
    n_sup = gram_steps or models["gram"].config.n_sup
    found[f"gram@{n_sup}"] = {"arch": "gram", "steps": n_sup}
    return found


def bench(
    task: Task,
    samples: int,
    repeats: int,
    warmup: int,
    mdlm_steps: list[int],
    gram_steps: int | None,
    seed: int,
) -> dict[str, Any]:
    built = {arch: build_model(arch, task, seed) for arch in ARCHS}
    models = {arch: model for arch, (model, _) in built.items()}
    puzzle = next(iter(task.examples("test", seed)))[0]
    x = torch.from_numpy(np.asarray(task.encode(puzzle), dtype=np.int64))[None]
    runs = variants(models, mdlm_steps, gram_steps)

    def draw(name: str) -> float:
        spec = runs[name]
        start = time.perf_counter()
        solve(models[spec["arch"]], x, steps=spec["steps"], samples=samples, select="first")
        return time.perf_counter() - start

    torch.manual_seed(seed)
    for _ in range(warmup):
        for name in runs:
            draw(name)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name in runs:  # the variants take turns: machine noise hits all of them
            times[name].append(draw(name))
    gram = next(name for name in runs if name.startswith("gram"))
    params = {arch: num_parameters(model) for arch, model in models.items()}
    report: dict[str, Any] = {}
    for name, spec in runs.items():
        model, median = models[spec["arch"]], statistics.median(times[name])
        c = model.config
        report[name] = {
            "model": spec["arch"],
            "config": built[spec["arch"]][1],
            "parameters": params[spec["arch"]],
            "sizes": {"dim": c.dim, "n_layers": c.n_layers, "hidden": c.hidden},
            "steps": 1 if spec["steps"] is None else spec["steps"],
            "step_kind": {"ar": "left-to-right pass", "mdlm": "unmasking steps"}.get(
                spec["arch"], f"supervision steps (T={c.cycles}, K={c.inner})"
            ),
            "batch_time_s": round(median, 4),
            "samples_per_s": round(samples / median, 2),
            "relative_to_gram": round(
                statistics.median(g / t for g, t in zip(times[gram], times[name], strict=True)), 3
            ),
            "batch_times_s": [round(t, 4) for t in times[name]],
        }
    return {
        "samples_per_batch": samples,
        "warmup_rounds": warmup,
        "repeats": repeats,
        "precision": "fp32",
        "temperature": 1.0,
        "parameters": params,
        "parameter_ratio_max_over_min": round(max(params.values()) / min(params.values()), 3),
        "variants": report,
    }


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="K: samples per batch (default 64)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds (default 1)")
    parser.add_argument("--mdlm-steps", default=None, help="comma-separated (default 4,8,16,32)")
    parser.add_argument("--gram-steps", type=int, default=None, help="GRAM's n_sup (default: its config's)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small, fast run (K=8, 2 repeats, no warm-up)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    quick = args.quick
    samples = args.samples or (8 if quick else 64)
    repeats = args.repeats or (2 if quick else 5)
    warmup = args.warmup if args.warmup is not None else (0 if quick else 1)
    mdlm_steps = [int(s) for s in (args.mdlm_steps or "4,8,16,32").split(",") if s.strip()]
    if samples < 1 or repeats < 1 or warmup < 0 or not mdlm_steps or min(mdlm_steps) < 1:
        parser.error("--samples, --repeats and --mdlm-steps must be positive, --warmup not negative")

    torch.set_num_threads(args.threads)
    task = get_task("nqueens", n=8)
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "task": "nqueens n=8",
        "quick": quick,
        "sampling": bench(task, samples, repeats, warmup, mdlm_steps, args.gram_steps, args.seed),
    }
    emit_json_report(report, args.output)


if __name__ == "__main__":
    main()
