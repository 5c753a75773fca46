"""Compiled decoding with one-row products as row dot products, against the same graphs on ``F.linear``.

    latentloop bench row_dot_decoding [--families huginn,ouro] [--batches 1,2] [--max-rows N] [--repeats 7]
                                      [--threads 2] [--output FILE]

:func:`latentloop.nn.linear.linear` multiplies a single row by a weight as a reduction that the compiler fuses
and splits across threads (``ROW_DOT_MAX_ROWS`` rows at most). For each model family (random fp32 weights:
the Huginn layout of ``compare_huginn_reference``'s model, and the hidden-512, 8-layer Ouro model of
``compare_ouro_reference``), each batch size and each depth, greedy compiled decoding of 32 tokens after 16
runs with the shipped threshold (or ``--max-rows``) and with the threshold at 0 (every product on
``F.linear``), one after the other in each repeat. Reported: tokens/s of each (medians), the median of the
per-repeat speed ratios, and whether both give eager decoding's tokens. Compilation is paid in a warm-up.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

import latentloop.nn.linear as linear_module
from latentloop.benchmarks.compare_ouro_reference import speed_config
from latentloop.errors import ArgumentParser
from latentloop.io import emit_json_report
from latentloop.models.generation import generate
from latentloop.models.ouro import OuroLM
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM
from latentloop.runtime import cpu_description

PROMPT, NEW_TOKENS = 16, 32


def models() -> dict[str, tuple[torch.nn.Module, list[int]]]:
    """Each family's benchmark model and the depths it is timed at."""
    torch.manual_seed(0)
    huginn = RecurrentDepthLM(
        RecurrentDepthConfig(
            n_embd=256,
            n_heads=4,
            n_layers_in_prelude=1,
            n_layers_in_recurrent_block=2,
            n_layers_in_coda=1,
            intermediate_size=704,
            vocab_size=512,
            block_size=256,
        )
    )
    ouro = OuroLM(speed_config())
    return {"huginn": (huginn.float().eval(), [8, 32]), "ouro": (ouro.eval(), [4, 8])}


def decoder(model: torch.nn.Module, prompt: torch.Tensor, steps: int) -> Callable[..., torch.Tensor]:
    def decode(max_rows: int | None = None) -> torch.Tensor:
        if max_rows is None:  # eager: the reference tokens
            return generate(
                model, prompt, max_new_tokens=NEW_TOKENS, num_steps=steps, init_scale=0.0
            ).sequences
        linear_module.ROW_DOT_MAX_ROWS = max_rows  # a guard of the compiled graphs: each value has its own
        return generate(
            model, prompt, max_new_tokens=NEW_TOKENS, num_steps=steps, init_scale=0.0, compile=True
        ).sequences

    return decode


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="huginn,ouro", help="model families, comma-separated")
    parser.add_argument("--batches", default="1,2", help="batch sizes, comma-separated")
    parser.add_argument(
        "--max-rows", type=int, default=None, help="the threshold to time (default: ROW_DOT_MAX_ROWS)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timed runs of each variant")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shipped = linear_module.ROW_DOT_MAX_ROWS
    tried = shipped if args.max_rows is None else args.max_rows
    families = args.families.split(",")
    rows = []
    try:
        for family, (model, depths) in ((f, m) for f, m in models().items() if f in families):
            for batch in (int(b) for b in args.batches.split(",")):
                torch._dynamo.reset()  # the graphs of each (family, batch) alone, within Dynamo's recompile limit
                prompt = torch.randint(
                    1, model.config.vocab_size, (batch, PROMPT), generator=torch.Generator().manual_seed(1)
                )
                for steps in depths:
                    decode = decoder(model, prompt, steps)
                    eager = decode()
                    same = {rows_: bool(torch.equal(decode(rows_), eager)) for rows_ in (tried, 0)}
                    times: dict[int, list[float]] = {tried: [], 0: []}
                    for _ in range(args.repeats):
                        for max_rows, seconds in times.items():
                            started = time.perf_counter()
                            decode(max_rows)
                            seconds.append(time.perf_counter() - started)
                    ratios = [off / on for on, off in zip(times[tried], times[0], strict=True)]
                    rows.append(
                        {
                            "family": family,
                            "batch": batch,
                            "steps": steps,
                            "row_dot_tokens_per_second": round(
                                batch * NEW_TOKENS / statistics.median(times[tried]), 2
                            ),
                            "linear_tokens_per_second": round(
                                batch * NEW_TOKENS / statistics.median(times[0]), 2
                            ),
                            "speedup": round(statistics.median(ratios), 3),
                            "same_tokens_as_eager": same[tried] and same[0],
                        }
                    )
    finally:
        linear_module.ROW_DOT_MAX_ROWS = shipped
    report = {
        "benchmark": "row_dot_decoding",
        "environment": {"cpu": cpu_description(), "torch": torch.__version__, "threads": args.threads},
        "row_dot_max_rows": tried,
        "prompt_len": PROMPT,
        "new_tokens": NEW_TOKENS,
        "repeats": args.repeats,
        "rows": rows,
    }
    emit_json_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
