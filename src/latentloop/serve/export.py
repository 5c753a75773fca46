"""A looped LM as one self-contained folder that the serving tools load as it is.

The folder holds the weights in the family's official layout (huginn-0125's or Ouro's ``config.json`` and
``model.safetensors``), the model card, and the tokenizer as ``tokenizer.json`` and ``tokenizer_config.json``
(with the chat template, when there is one). ``vllm serve FOLDER`` (latentloop's plugin), transformers'
``AutoTokenizer``, ``latentloop serve``, ``generate`` and ``harness`` read it, and ``hf upload`` publishes it.
A training run keeps no tokenizer beside its checkpoints (the byte-level one needs no file), so this is the step
between a run and a server that loads text.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from latentloop.data.tokenizers import save_hf_tokenizer
from latentloop.errors import UsageError
from latentloop.hub import resolve_model
from latentloop.infer.runs import lm_tokenizer
from latentloop.io import writing_to
from latentloop.models.looped_lms import load_looped_lm, save_quantized
from latentloop.nn.quantized import is_quantized
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


def export_lm(
    model: str | Path,
    out: str | Path,
    tokenizer: str | Path | None = None,
    chat_template: Path | None = None,
    revision: str | None = None,
    weights: str | None = None,
) -> Path:
    """Write the looped LM at ``model`` (a run folder, a checkpoint folder or a Hub id) into the new folder
    ``out``, with its tokenizer (``tokenizer``, else the checkpoint's, else its run's, else bytes) and chat template
    (the file ``chat_template``, else the one beside the model); ``out`` appears complete or not at all. With
    ``weights`` (``int8``) the weights are quantized and written in latentloop's quantized layout
    (:func:`~latentloop.models.looped_lms.save_quantized`), which latentloop loads and vLLM does not."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty folder")
    folder = resolve_checkpoint(resolve_model(model, revision))
    lm = load_looped_lm(folder, weights=weights)
    tok = lm_tokenizer(folder, tokenizer)
    if tok.vocab_size > lm.config.vocab_size:
        raise UsageError(
            f"the tokenizer has {tok.vocab_size} ids, more than the model's vocab_size {lm.config.vocab_size}"
        )
    template = chat_template_of(folder, chat_template)
    with writing_to(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if is_quantized(lm):
            save_quantized(lm, temp)
        else:
            lm.save_pretrained(temp)
        save_hf_tokenizer(tok, temp, lm.config.vocab_size, lm.config.block_size, template)
        os.replace(temp, out)  # onto an empty folder too
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return out
