"""``latentloop generate``: continue a prompt with a recurrent-depth checkpoint."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer

from latentloop.cli.app import REVISION, app
from latentloop.cli.options import options_of, with_options
from latentloop.errors import UsageError
from latentloop.models.generation import GenerationConfig
from latentloop.models.parallel_sampler import ParallelSampler


@app.command()
@with_options(
    options_of(GenerationConfig, types={"exit": str | None, "sampler": str}),
    options_of(ParallelSampler),
)
def generate(
    model: str = typer.Argument(
        ...,
        help="Checkpoint folder (config.json + model.safetensors), a run folder, or a Hub model id org/name.",
    ),
    prompt: str = typer.Argument(..., help="The text to continue."),
    revision: str = REVISION,
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy; above 0 samples."),
    seed: int = typer.Option(0, "--seed", help="Seed for the initial states and sampling."),
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="tokenizer.json (default: the model's, else its run's, else bytes)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print text, tokens, tokens/s and mean iterations as JSON."
    ),
    **settings: Any,
) -> None:
    """Generate text with a looped LM (recurrent-depth/Huginn or Ouro) at any test-time depth. Its options
    beyond the first four are GenerationConfig's fields."""
    import torch

    from latentloop.hub import resolve_model
    from latentloop.infer.runs import lm_tokenizer
    from latentloop.models.generation import generate as run_generation
    from latentloop.models.looped_lms import load_looped_lm
    from latentloop.train.checkpoint import resolve_checkpoint

    if not prompt:
        raise UsageError("the prompt is empty")
    if settings["max_new_tokens"] < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {settings['max_new_tokens']}")
    # Checked before the model loads, so a bad option fails fast.
    knobs = {f.name for f in dataclasses.fields(ParallelSampler)}
    sampler = {k: settings.pop(k) for k in knobs}
    if settings["sampler"] == "parallel":
        settings["sampler"] = ParallelSampler(**sampler)
    config = GenerationConfig(do_sample=temperature > 0, temperature=temperature or 1.0, **settings)
    folder = resolve_checkpoint(resolve_model(model, revision))
    lm = load_looped_lm(folder, weights=config.weights)  # quantized once, without keeping a float copy
    tok = lm_tokenizer(folder, tokenizer)
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
    if not as_json:
        typer.echo(prompt + text)
        return
    shown = ("exit", "kv_share", "speculative", "compile", "prepack", "screen_head", "weights")
    result = {
        "text": text,
        "tokens": new,
        "tokens_per_second": round(out.tokens_per_second, 3),
        "mean_iterations_per_token": round(out.mean_steps, 3),
        "num_steps": config.num_steps or lm.config.mean_recurrence,
        **{name: settings[name] for name in shown},
        "sampler": "parallel" if config.parallel is not None else "sequential",
        **({"sweeps": out.sweeps} if out.sweeps is not None else {}),
        **({"mean_passes_per_token": round(out.mean_passes, 3)} if out.passes is not None else {}),
    }
    typer.echo(json.dumps(result))
