"""How long `latentloop solve` takes with a shipped model: the command, one call, and each test-time setting.

    latentloop bench solve_latency [--model sudoku9-gram] [--puzzles 8] [--repeats 3] [--threads 2] [--output FILE]

On held-out puzzles of the shipped model's task (its test split), three times, each the median over puzzles:

- ``command_s``: ``latentloop solve TASK PUZZLE`` as a user types it, a new process each time (Python and
  torch start, the model loads, the puzzle is solved at the model's shipped setting), beside
  ``startup_s``: a process that only imports what the command imports (torch included), so the difference
  (``solve_in_command_s``) is what the solve itself costs;
- ``call_ms``: :func:`latentloop.infer.solve.solve_puzzle` in this process at the shipped setting (the
  model loads from disk, as in the command);
- ``settings``: the model loaded once, one puzzle at a time, at each (steps, samples) setting: milliseconds
  per puzzle and the share of the puzzles solved, with the shipped selection and state noise (one sample runs
  without noise: the plain trajectory).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from latentloop.config import load_yaml
from latentloop.errors import ArgumentParser, UsageError
from latentloop.infer.scaling import solve
from latentloop.infer.solve import solve_puzzle
from latentloop.io import emit_json_report
from latentloop.models.reasoners import load_reasoner
from latentloop.paths import PRETRAINED_DIR
from latentloop.pretrained import pretrained_solve_settings, pretrained_task_spec, solve_setting
from latentloop.runtime import median_seconds
from latentloop.tasks.base import get_task, parse_task_spec


def _parser() -> ArgumentParser:
    """The command line of :func:`main`."""
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sudoku9-gram", help="a shipped model's folder name")
    parser.add_argument("--puzzles", type=int, default=8, help="held-out puzzles")
    parser.add_argument(
        "--repeats", type=int, default=3, help="command runs per puzzle (the first 2 puzzles)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the command's too)")
    parser.add_argument("--grid", default="1x1,4x1,8x1,4x20,8x20,16x20", help="STEPSxSAMPLES settings")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    folder = PRETRAINED_DIR / args.model
    try:
        if not (folder / "run.yaml").is_file():
            raise UsageError(f"no shipped model {args.model!r} in {PRETRAINED_DIR}")
        grid = [tuple(int(v) for v in cell.split("x")) for cell in args.grid.split(",")]
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    spec = pretrained_task_spec(folder)
    name, options = parse_task_spec(spec)[:2]
    task = get_task(name, **options)
    shipped = pretrained_solve_settings(folder)
    seed = int(load_yaml(folder / "run.yaml")["train"]["seed"])
    puzzles = []
    for puzzle, _ in task.examples("test", seed):
        puzzles.append(puzzle)
        if len(puzzles) == args.puzzles:
            break
    texts = [task.format(p) for p in puzzles]

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, "-m", "latentloop", "solve", name, "--json"]

    def run_command(text: str) -> None:
        subprocess.run([*command, text], env=env, capture_output=True, check=False)

    startup = [sys.executable, "-c", "import latentloop.cli, latentloop.eval.reasoners"]
    startup_s = median_seconds(lambda: subprocess.run(startup, env=env, check=True), args.repeats)
    command_s = statistics.median(median_seconds(lambda t=t: run_command(t), args.repeats) for t in texts[:2])
    setting = solve_setting(folder)
    call_ms = 1e3 * statistics.median(
        median_seconds(lambda p=p: solve_puzzle(str(folder), task, p, model_task=spec, **setting), 1)
        for p in puzzles
    )
    model = load_reasoner(folder).eval()
    rows = []
    for steps, samples in grid:
        times, solved = [], []
        for puzzle in puzzles:
            tokens = torch.from_numpy(np.asarray(task.encode(puzzle), dtype=np.int64))[None]
            start = time.perf_counter()
            result = solve(
                model,
                tokens,
                steps=steps,
                samples=samples,
                select=setting["select"],
                state_noise=setting["state_noise"] if samples > 1 else 0.0,
            )
            times.append(time.perf_counter() - start)
            solved.append(task.verify(puzzle, task.decode_answer(result.chosen[0].numpy())))
        rows.append(
            {
                "steps": steps,
                "samples": samples,
                "ms": round(1e3 * statistics.median(times), 1),
                "solved": round(float(np.mean(solved)), 3),
            }
        )
    report = {
        "benchmark": "solve_latency",
        "model": args.model,
        "task": spec,
        "shipped_setting": shipped,
        "threads": args.threads,
        "puzzles": len(puzzles),
        "startup_s": round(startup_s, 3),
        "command_s": round(command_s, 3),
        "solve_in_command_s": round(command_s - startup_s, 3),
        "call_ms": round(call_ms, 1),
        "settings": rows,
    }
    emit_json_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
