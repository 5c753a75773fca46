"""What ``latentloop serve`` serves: a looped LM from a folder, run or Hub id, with its tokenizer and chat
template."""

from __future__ import annotations

from pathlib import Path

from latentloop.hub import resolve_model
from latentloop.infer.runs import lm_tokenizer
from latentloop.models.generation import GenerationConfig
from latentloop.models.looped_lms import load_looped_lm
from latentloop.serve.engine import Engine
from latentloop.serve.export import chat_template_of
from latentloop.serve.openai_api import Served
from latentloop.train.checkpoint import resolve_checkpoint


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
    weights: str | None = None,
) -> Served:
    """The model at ``model`` (a checkpoint folder, a run folder or a Hub id) ready to serve, with the
    deployment's defaults for what a request leaves out (``init_scale``, ``num_steps``, ``exit``); ``weights``
    (``int8``) quantizes the linear and embedding weights as they load."""
    GenerationConfig(
        num_steps=num_steps, init_scale=init_scale, exit=exit, weights=weights
    )  # refuses bad values before loading
    folder = resolve_checkpoint(resolve_model(model, revision))
    lm = load_looped_lm(folder, weights=weights)
    return Served(
        Engine(lm, max_batch=max_batch, kv_share=kv_share),
        lm_tokenizer(folder, tokenizer),
        name or model,
        chat_template_of(folder, chat_template),
        init_scale,
        num_steps,
        exit,
    )
