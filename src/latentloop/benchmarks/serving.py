"""Serving: `latentloop serve`'s tokens/s with concurrent clients against one client at a time and against
`generate` in-process, and, on a trained arithmetic run, what a per-token exit saves when served.

    .venv/bin/python benchmarks/serving.py --random huginn --clients 8 --max-tokens 64
    .venv/bin/python benchmarks/serving.py --model runs/lm-arithmetic --exit kl:5e-4 --depth 32 --problems 200

The server runs as its own process (`latentloop serve`, `--threads` torch threads) on a loopback port; the
clients are threads of this process. Every request is greedy, from a zero initial state. Throughput: each repeat
runs, one after the other, `--requests` requests through `generate` one at a time in this process (the server
idle), the same requests through the server one client at a time, and the same requests from `--clients`
concurrent clients; tokens/s is completion tokens over wall time, and each ratio is the median of the
per-repeat ratios. The server's tokens are compared with `generate`'s, request by request. With `--exit` on an arithmetic run, the task's held-out problems are served at fixed depth
and with the exit criterion, from `--clients` concurrent clients: accuracy (the task's verifier), mean depth per
token (the server's `usage.mean_depth`) and the share of core iterations saved. With `--load N`, N rounds of 64
concurrent clients (a third plain, a third streaming, a third leaving after the first chunk): how each request
ended, and the server's resident memory after each round. Prints one JSON object.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from latentloop.errors import ArgumentParser, UsageError
from latentloop.io import atomic_write_text
from latentloop.models.generation import generate
from latentloop.models.looped_lms import load_looped_lm
from latentloop.models.ouro import OuroConfig, OuroLM
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.tasks.base import get_task
from latentloop.train.checkpoint import resolve_checkpoint, run_folder_of
from latentloop.train.run_config import load_run_config

try:  # the clients; the serve extra installs it
    import httpx
except ImportError:
    httpx = None

# Random models in each family's official layout at head dimension 64, about 50M parameters and more.
RANDOM_SHAPES = {
    "huginn": dict(
        n_embd=512,
        n_heads=8,
        n_layers_in_prelude=2,
        n_layers_in_recurrent_block=4,
        n_layers_in_coda=2,
        intermediate_size=2048,
        vocab_size=32768,
        block_size=1024,
        mean_recurrence=4,
    ),
    "ouro": dict(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=8,
        vocab_size=32768,
        max_position_embeddings=1024,
        total_ut_steps=4,
    ),
}


def random_model(family: str, folder: Path) -> int:
    """Writes a random model of ``family`` to ``folder``; returns its parameter count."""
    torch.manual_seed(0)
    if family == "huginn":
        model = RecurrentDepthLM(RecurrentDepthConfig(**RANDOM_SHAPES["huginn"]))
    else:
        model = OuroLM(OuroConfig(**RANDOM_SHAPES["ouro"]))
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


class Server:
    """An OpenAI-compatible server in a child process on a free loopback port: ``command`` with ``--port`` added,
    its output written to ``log`` (dropped without one); ``url`` is its root."""

    def __init__(
        self, command: list[str], env: dict[str, str] | None = None, log: Path | None = None
    ) -> None:
        self.client = httpx.Client(timeout=None)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        # A file, not a pipe: a full pipe would stall the server.
        with open(log, "w") if log is not None else contextlib.nullcontext(subprocess.DEVNULL) as output:
            command = [*command, "--port", str(self.port)]
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        while True:
            if self.process.poll() is not None:
                tail = f": {log.read_text()[-1500:]}" if log is not None else ""
                raise UsageError(
                    f"{' '.join(command[2:5])} exited with status {self.process.returncode}{tail}"
                )
            try:
                if self.client.get(f"{self.url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)

    def complete(self, body: dict) -> dict:
        reply = self.client.post(f"{self.url}/v1/completions", json={"model": "bench", **body})
        reply.raise_for_status()
        return reply.json()

    def close(self) -> None:
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()


def latentloop_serve(folder: Path, threads: int, max_batch: int) -> list[str]:
    """``latentloop serve FOLDER`` as the benchmarks run it: greedy from a zero state, named ``bench``."""
    command = [sys.executable, "-m", "latentloop", "serve", str(folder), "--init-scale", "0"]
    command += ["--threads", str(threads), "--max-batch", str(max_batch)]
    return [*command, "--served-model-name", "bench"]


def concurrently(server: Server, bodies: list[dict], clients: int) -> tuple[list[dict], float]:
    """The replies to ``bodies`` from ``clients`` concurrent clients, and the wall time."""
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        replies = list(pool.map(server.complete, bodies))
    return replies, time.perf_counter() - started


def _token_ids(reply: dict) -> list[int]:
    return [int(name.removeprefix("token_id:")) for name in reply["choices"][0]["logprobs"]["tokens"]]


def throughput(args, folder: Path) -> dict:
    model = load_looped_lm(folder)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(
            1, 256, (int(torch.randint(8, 64, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(args.requests)
    ]
    common = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "num_steps": args.depth}
    common |= {"logprobs": 0, "return_tokens_as_token_ids": True}  # the tokens, to compare with generate's
    bodies = [{"prompt": prompt, **common} for prompt in prompts]
    server = Server(latentloop_serve(folder, args.threads, args.max_batch))
    rounds, identical = [], []
    try:
        # One untimed request each way first: the first call of a process pays for allocations and warm-up.
        generate(model, torch.tensor([prompts[0]]), max_new_tokens=2, num_steps=args.depth, init_scale=0.0)
        concurrently(server, [{**bodies[0], "max_tokens": 2}], 1)
        for _ in range(args.repeats):
            started = time.perf_counter()
            alone = []
            for prompt in prompts:
                out = generate(
                    model,
                    torch.tensor([prompt]),
                    max_new_tokens=args.max_tokens,
                    num_steps=args.depth,
                    init_scale=0.0,
                )
                alone.append(out.sequences[0, len(prompt) :].tolist())
            generate_seconds = time.perf_counter() - started
            one, one_seconds = concurrently(server, bodies, 1)
            many, many_seconds = concurrently(server, bodies, args.clients)
            tokens = args.requests * args.max_tokens
            assert all(r["usage"]["completion_tokens"] == args.max_tokens for r in one + many)
            served = [_token_ids(reply) for reply in one] + [_token_ids(reply) for reply in many]
            identical.append(served == alone + alone)
            rounds.append(
                {
                    "generate_tokens_per_second": tokens / generate_seconds,
                    "one_client_tokens_per_second": tokens / one_seconds,
                    "concurrent_tokens_per_second": tokens / many_seconds,
                }
            )
    finally:
        server.close()
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "depth": args.depth,
        "clients": args.clients,
        "median": {key: round(value, 2) for key, value in median.items()},
        "tokens_identical_to_generate": all(identical),
        "concurrent_over_one_client": round(
            statistics.median(
                r["concurrent_tokens_per_second"] / r["one_client_tokens_per_second"] for r in rounds
            ),
            3,
        ),
        "concurrent_over_generate": round(
            statistics.median(
                r["concurrent_tokens_per_second"] / r["generate_tokens_per_second"] for r in rounds
            ),
            3,
        ),
        "rounds": rounds,
    }


def _rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (Linux), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(args, folder: Path) -> dict:
    """``--load`` rounds of 64 concurrent clients: a third plain, a third streaming, a third leaving after
    the first chunk; every outcome counted, the server's memory after each round."""
    server = Server(latentloop_serve(folder, args.threads, args.max_batch))

    def client(index: int) -> str:
        body = {
            "model": "bench",
            "prompt": f"client {index}",
            "max_tokens": 16 + index % 16,
            "temperature": 0,
        }
        body |= {"ignore_eos": True, "num_steps": 1 + index % 8}
        url = f"{server.url}/v1/completions"
        try:
            with httpx.Client(timeout=None) as http:
                if index % 3 == 0:
                    reply = http.post(url, json=body)
                    return "ok" if reply.status_code == 200 else f"status {reply.status_code}"
                with http.stream("POST", url, json={**body, "stream": True}) as reply:
                    if reply.status_code != 200:
                        return f"status {reply.status_code}"
                    for line in reply.iter_lines():
                        if index % 3 == 2 and line.startswith("data: "):
                            return "left"
                        if line == "data: [DONE]":
                            return "ok"
            return "no [DONE]"
        except httpx.HTTPError as error:
            return type(error).__name__

    rounds = []
    try:
        for _ in range(args.load):
            started = time.perf_counter()
            with ThreadPoolExecutor(64) as pool:
                outcomes = list(pool.map(client, range(64)))
            while httpx.get(f"{server.url}/health").json()["requests"]:
                time.sleep(0.1)
            counts = {name: outcomes.count(name) for name in sorted(set(outcomes))}
            rounds.append(
                {
                    "outcomes": counts,
                    "seconds": round(time.perf_counter() - started, 2),
                    "server_rss_mib": round(_rss_mib(server.process.pid), 1),
                }
            )
    finally:
        server.close()
    return {"clients": 64, "rounds": rounds}


def adaptive_exit(args, folder: Path) -> dict:
    run = run_folder_of(folder)
    if run is None:
        raise UsageError(f"{folder} is not inside a run folder, so its task is unknown")
    config = load_run_config(run / "config.yaml", [])
    task = get_task(config.task.name, **config.task.options)
    problems = task.test_problems()[: args.problems]
    server = Server(latentloop_serve(folder, args.threads, args.max_batch))
    report = {}
    try:
        for name, extra in (("fixed_depth", {}), ("with_exit", {"exit": args.exit})):
            bodies = [
                {
                    "prompt": task.encode(problem),
                    "max_tokens": len(task.answer(problem)) + 1,
                    "temperature": 0,
                    "num_steps": args.depth,
                    **extra,
                }
                for problem in problems
            ]
            replies, seconds = concurrently(server, bodies, args.clients)
            answers = [reply["choices"][0]["text"] for reply in replies]
            tokens = sum(r["usage"]["completion_tokens"] for r in replies)
            depth = sum(r["usage"]["mean_depth"] * r["usage"]["completion_tokens"] for r in replies) / tokens
            report[name] = {
                "accuracy": sum(task.verify(p, a) for p, a in zip(problems, answers, strict=True))
                / len(problems),
                "mean_depth": round(depth, 3),
                "tokens_per_second": round(tokens / seconds, 2),
                "answers": answers,
            }
    finally:
        server.close()
    agree = sum(
        a == b
        for a, b in zip(report["fixed_depth"].pop("answers"), report["with_exit"].pop("answers"), strict=True)
    )
    return {
        "task": {"name": config.task.name, **config.task.options},
        "problems": len(problems),
        "depth": args.depth,
        "exit": args.exit,
        "clients": args.clients,
        **report,
        "core_iterations_saved": round(
            1 - report["with_exit"]["mean_depth"] / report["fixed_depth"]["mean_depth"], 4
        ),
        "answers_agreeing": agree / len(problems),
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="checkpoint or run folder to serve")
    source.add_argument(
        "--random", choices=sorted(RANDOM_SHAPES), help="a random model of this family's layout"
    )
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=16, help="requests per round (throughput)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (throughput)")
    parser.add_argument(
        "--depth", type=int, default=None, help="core iterations per token (default: the model's)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (throughput)")
    parser.add_argument(
        "--exit", default=None, help="an exit criterion: serve a trained arithmetic run's problems"
    )
    parser.add_argument("--problems", type=int, default=200, help="held-out problems (--exit)")
    parser.add_argument(
        "--load", type=int, default=0, help="rounds of 64 concurrent clients (0: no load test)"
    )
    parser.add_argument("--max-batch", type=int, default=16, help="the server's --max-batch")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the server and of generate")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    for name in ("clients", "requests", "max_tokens", "problems", "max_batch"):
        if getattr(args, name) < 1:
            parser.error(
                f"argument --{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}"
            )
    if args.depth is not None and args.depth < 1:
        parser.error(f"argument --depth: must be at least 1, got {args.depth}")
    missing = [name for name in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"error: benchmarks/serving.py needs {missing[0]}: pip install 'latentloop[serve]'",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            header = {"machine": platform.processor() or platform.machine(), "threads": args.threads}
            if args.random:
                folder = Path(scratch) / args.random
                header |= {"model": f"random {args.random}", "parameters": random_model(args.random, folder)}
            else:
                folder = resolve_checkpoint(args.model)
                header["model"] = str(args.model)
            if args.load:
                report = header | load(args, folder)
            elif args.exit is not None:
                if args.depth is None:
                    raise UsageError("--exit needs --depth (the fixed depth it is compared with)")
                report = header | adaptive_exit(args, folder)
            else:
                report = header | throughput(args, folder)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    print(text)
    if args.output is not None:
        atomic_write_text(args.output, text + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
