"""``latentloop generate``: continue a prompt with a recurrent-depth checkpoint."""

from __future__ import annotations

import dataclasses
import json

import typer

from latentloop.cli.app import REVISION, app
from latentloop.errors import UsageError


@app.command()
def generate(
    model: str = typer.Argument(
        ...,
        help="Checkpoint folder (config.json + model.safetensors), a run folder, or a Hub model id org/name.",
    ),
    prompt: str = typer.Argument(..., help="The text to continue."),
    revision: str = REVISION,
    num_steps: int = typer.Option(
        None, "--num-steps", "-r", help="Core iterations per token (default: the mean)."
    ),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n", help="Tokens to generate at most."),
    exit_criterion: str = typer.Option(
        None,
        "--exit",
        help="Per-token early exit, e.g. kl:5e-4, entropy-diff:1e-3, latent-diff:0.03, cosine; Ouro: gate:0.9 "
        "(skips the steps after the exit) or gate-full:0.9 (computes them, as the official code, after the "
        "token is chosen).",
    ),
    kv_share: int = typer.Option(
        None, "--kv-share", help="Core KV-cache slots (iteration i uses slot i mod k)."
    ),
    continuous: bool = typer.Option(
        False, "--continuous", help="Warm-start each token from the previous state."
    ),
    speculative: int = typer.Option(
        None, "--speculative", help="Draft with this many iterations, verify at full depth."
    ),
    draft_tokens: int = typer.Option(4, "--draft-tokens", help="Tokens drafted per speculative round."),
    sampler: str = typer.Option(
        "sequential",
        "--sampler",
        help="sequential, or parallel: a wavefront of positions decoded at once (diffusion-style).",
    ),
    wavefront: int = typer.Option(32, "--wavefront", help="Parallel sampler: positions in flight at most."),
    inner_steps: int = typer.Option(4, "--inner-steps", help="Parallel sampler: core iterations per sweep."),
    freeze: str = typer.Option(
        "latent-diff:0.03",
        "--freeze",
        help="Parallel sampler: when a position is final, latent-diff:t (relative change below t) or steps "
        "(after --num-steps iterations, always the cap).",
    ),
    state_noise: float = typer.Option(
        0.0,
        "--state-noise",
        help="Parallel sampler: noise mixed into in-flight states, damped by iterations.",
    ),
    compile_steps: bool = typer.Option(
        False,
        "--compile",
        help="Run each token's prelude, core iterations and coda as torch.compile graphs: faster decoding "
        "after a compilation of some seconds (counted in --json's tokens/s).",
    ),
    prepack: bool = typer.Option(
        False,
        "--prepack",
        help="Decode through a copy of the model with its linear weights repacked for oneDNN's CPU kernels: "
        "faster eager decoding, at a second copy of those weights.",
    ),
    screen_head: bool = typer.Option(
        False,
        "--screen-head",
        help="Greedy only: choose each token from an fp16 copy of the output layer, computing in fp32 only the "
        "logits that can be the largest. The same tokens, reading half the bytes of the largest weight.",
    ),
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy; above 0 samples."),
    top_k: int = typer.Option(None, "--top-k", help="Sample only among the k most likely tokens."),
    top_p: float = typer.Option(None, "--top-p", help="Sample only within this probability mass."),
    init_scale: float = typer.Option(
        1.0, "--init-scale", help="Scale of the random initial state (0 = zeros)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the initial states and sampling."),
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="tokenizer.json (default: the model's, else bytes)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print text, tokens, tokens/s and mean iterations as JSON."
    ),
) -> None:
    """Generate text with a looped LM (recurrent-depth/Huginn or Ouro) at any test-time depth."""
    import torch

    from latentloop.data.tokenizers import load_tokenizer
    from latentloop.hub import resolve_model
    from latentloop.models.generation import GenerationConfig
    from latentloop.models.generation import generate as run_generation
    from latentloop.models.looped_lms import load_looped_lm
    from latentloop.models.parallel_sampler import ParallelSampler
    from latentloop.train.checkpoint import resolve_checkpoint

    if not prompt:
        raise UsageError("the prompt is empty")
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    # Checked before the model loads, so a bad option fails fast.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        num_steps=num_steps,
        init_scale=init_scale,
        do_sample=temperature > 0,
        temperature=temperature or 1.0,
        top_k=top_k,
        top_p=top_p,
        kv_share=kv_share,
        exit=exit_criterion,
        continuous=continuous,
        speculative=speculative,
        draft_tokens=draft_tokens,
        sampler=ParallelSampler(wavefront, inner_steps, freeze, state_noise)
        if sampler == "parallel"
        else sampler,
        compile=compile_steps,
        prepack=prepack,
        screen_head=screen_head,
    )
    folder = resolve_checkpoint(resolve_model(model, revision))
    lm = load_looped_lm(folder)
    tok_spec = tokenizer or (folder / "tokenizer.json" if (folder / "tokenizer.json").is_file() else None)
    tok = load_tokenizer(tok_spec)
    ids = tok.encode(prompt)
    if not ids:
        raise UsageError("the prompt encodes to no tokens")
    if max(ids) >= lm.config.vocab_size:
        raise UsageError(f"the tokenizer's ids exceed the model's vocab_size {lm.config.vocab_size}")
    torch.manual_seed(seed)
    out = run_generation(
        lm,
        torch.tensor([ids]),
        dataclasses.replace(config, stop_tokens=[tok.eos_id]),
        generator=torch.Generator().manual_seed(seed),
    )
    new = out.sequences[0, len(ids) :].tolist()
    text = tok.decode(new)
    if as_json:
        result = {
            "text": text,
            "tokens": new,
            "tokens_per_second": round(out.tokens_per_second, 3),
            "mean_iterations_per_token": round(out.mean_steps, 3),
            "num_steps": num_steps or lm.config.mean_recurrence,
            "exit": exit_criterion,
            "kv_share": kv_share,
            "speculative": speculative,
            "sampler": sampler,
            "compile": compile_steps,
            "prepack": prepack,
            "screen_head": screen_head,
            **({"sweeps": out.sweeps} if out.sweeps is not None else {}),
            **({"mean_passes_per_token": round(out.mean_passes, 3)} if out.passes is not None else {}),
        }
        typer.echo(json.dumps(result))
    else:
        typer.echo(prompt + text)
