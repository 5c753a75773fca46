"""What ``latentloop serve`` serves: a looped LM from a folder, run or Hub id, with its tokenizer and chat
template."""

from __future__ import annotations

import json
from pathlib import Path

from latentloop.data.tokenizers import load_tokenizer
from latentloop.errors import UsageError
from latentloop.hub import resolve_model
from latentloop.models.generation import GenerationConfig
from latentloop.models.looped_lms import load_looped_lm
from latentloop.serve.engine import Engine
from latentloop.serve.openai_api import Served
from latentloop.train.checkpoint import resolve_checkpoint


def chat_template_of(folder: Path, path: Path | None = None) -> str | None:
    """The chat template: the file ``path``, else ``tokenizer_config.json``'s ``chat_template`` (or a
    ``chat_template.jinja``) beside the model, else None."""
    if path is not None:
        if not Path(path).is_file():
            raise UsageError(f"chat template file {path} does not exist")
        return Path(path).read_text(encoding="utf-8")
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if config.is_file():
        try:
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        except json.JSONDecodeError as error:
            raise UsageError(f"{config} is not valid JSON: {error}") from None
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        return template if isinstance(template, str) else None
    return None


def load_served(
    model: str,
    revision: str | None = None,
    name: str | None = None,
    tokenizer: str | None = None,
    chat_template: Path | None = None,
    max_batch: int = 16,
    kv_share: int | None = None,
    init_scale: float = 1.0,
    num_steps: int | None = None,
    exit: str | None = None,
) -> Served:
    """The model at ``model`` (a checkpoint folder, a run folder or a Hub id) ready to serve, with the
    deployment's defaults for what a request leaves out (``init_scale``, ``num_steps``, ``exit``)."""
    GenerationConfig(
        num_steps=num_steps, init_scale=init_scale, exit=exit
    )  # refuses bad values before loading
    folder = resolve_checkpoint(resolve_model(model, revision))
    lm = load_looped_lm(folder)
    spec = tokenizer or (folder / "tokenizer.json" if (folder / "tokenizer.json").is_file() else None)
    return Served(
        Engine(lm, max_batch=max_batch, kv_share=kv_share),
        load_tokenizer(spec),
        name or model,
        chat_template_of(folder, chat_template),
        init_scale,
        num_steps,
        exit,
    )
