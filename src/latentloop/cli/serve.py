"""``latentloop serve``: an OpenAI-compatible server for a looped LM, with the depth and exit each request asks;
``latentloop export``: a looped LM with its tokenizer as one folder that servers load; ``latentloop quantize``: the
same with int8 weights."""

from __future__ import annotations

from pathlib import Path

import typer

from latentloop.cli.app import REVISION, WEIGHTS, app
from latentloop.errors import UsageError

INSTALL_HINT = "pip install 'latentloop[serve]' (or pip install fastapi uvicorn)"


@app.command()
def serve(
    model: str = typer.Argument(
        ...,
        help="Checkpoint folder (config.json + model.safetensors), a run folder, or a Hub model id org/name.",
    ),
    revision: str = REVISION,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    served_model_name: str = typer.Option(
        None, "--served-model-name", help="The name clients ask for (default: the model argument)."
    ),
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="tokenizer.json (default: the model's, else its run's, else bytes)."
    ),
    chat_template: Path = typer.Option(
        None,
        "--chat-template",
        help="A Jinja chat template file (default: tokenizer_config.json's chat_template beside the model).",
    ),
    max_batch: int = typer.Option(16, "--max-batch", help="Requests decoded together; the others wait."),
    kv_share: int = typer.Option(
        None, "--kv-share", help="Core KV-cache slots (iteration i uses slot i mod k)."
    ),
    num_steps: int = typer.Option(
        None, "--num-steps", "-r", help="Default core iterations per token (default: the model's mean)."
    ),
    exit_criterion: str = typer.Option(
        None, "--exit", help="Default per-token exit, e.g. kl:5e-4 (a request's `exit` overrides it)."
    ),
    init_scale: float = typer.Option(
        1.0, "--init-scale", help="Default scale of the random initial state (0 = zeros: deterministic)."
    ),
    threads: int = typer.Option(None, "--threads", help="Torch threads (default: torch's)."),
    weights: str = WEIGHTS,
) -> None:
    """Serve a looped LM (recurrent-depth/Huginn or Ouro) over OpenAI's API: /v1/completions and
    /v1/chat/completions (streaming too), /v1/models, /health. Concurrent requests decode as one batch, each
    at its own depth (`num_steps`) and exit (`exit`, e.g. kl:5e-4); docs/serving.md."""
    try:
        import uvicorn

        from latentloop.serve.openai_api import Served, create_app
    except ImportError as error:
        if (error.name or "").startswith("latentloop"):
            raise
        raise UsageError(f"latentloop serve needs fastapi and uvicorn ({error}): {INSTALL_HINT}") from None
    import torch

    from latentloop.serve.loading import load_served

    if max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1, got {max_batch}")
    if kv_share is not None and kv_share < 1:
        raise UsageError(f"--kv-share must be at least 1, got {kv_share}")
    if init_scale < 0:
        raise UsageError(f"--init-scale must be >= 0, got {init_scale}")
    if num_steps is not None and num_steps < 1:
        raise UsageError(f"--num-steps must be at least 1, got {num_steps}")
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    served: Served = load_served(
        model,
        revision=revision,
        name=served_model_name,
        tokenizer=tokenizer,
        chat_template=chat_template,
        max_batch=max_batch,
        weights=weights,
        kv_share=kv_share,
        init_scale=init_scale,
        num_steps=num_steps,
        exit=exit_criterion,
    )
    typer.echo(f"serving {served.name} on http://{host}:{port}/v1 (max batch {max_batch})", err=True)
    uvicorn.run(create_app(served), host=host, port=port, log_level="warning", timeout_graceful_shutdown=60)


@app.command("export")
def export(
    model: str = typer.Argument(
        ..., help="A run folder, a checkpoint folder (config.json + model.safetensors), or a Hub model id."
    ),
    out: Path = typer.Option(..., "--out", help="The folder to write (must not exist, or be empty)."),
    revision: str = REVISION,
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="tokenizer.json (default: the model's, else its run's, else bytes)."
    ),
    chat_template: Path = typer.Option(
        None,
        "--chat-template",
        help="A Jinja chat template file (default: tokenizer_config.json's chat_template beside the model).",
    ),
) -> None:
    """Write a looped LM with its tokenizer as one folder that `vllm serve`, transformers' AutoTokenizer,
    `latentloop serve` and `hf upload` take as it is: the weights in the family's official layout,
    tokenizer.json and tokenizer_config.json (with the chat template); docs/serving.md."""
    from latentloop.serve.export import export_lm

    folder = export_lm(model, out, tokenizer=tokenizer, chat_template=chat_template, revision=revision)
    typer.echo(f"wrote {folder}")


@app.command("quantize")
def quantize(
    model: str = typer.Argument(
        ..., help="A run folder, a checkpoint folder (config.json + model.safetensors), or a Hub model id."
    ),
    out: Path = typer.Option(..., "--out", help="The folder to write (must not exist, or be empty)."),
    weights: str = typer.Option(
        "int8", "--weights", help="The weight format: int8 (one scale per output row)."
    ),
    revision: str = REVISION,
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="tokenizer.json (default: the model's, else its run's, else bytes)."
    ),
    chat_template: Path = typer.Option(
        None,
        "--chat-template",
        help="A Jinja chat template file (default: tokenizer_config.json's chat_template beside the model).",
    ),
) -> None:
    """Write a looped LM with its linear and embedding weights quantized (int8, a quarter of fp32's bytes) and
    its tokenizer as one folder that generate, harness, serve and load_looped_lm load as it is; docs/lm.md."""
    from latentloop.serve.export import export_lm

    folder = export_lm(
        model, out, tokenizer=tokenizer, chat_template=chat_template, revision=revision, weights=weights
    )
    typer.echo(f"wrote {folder}")
