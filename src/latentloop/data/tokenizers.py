"""Tokenizers: a byte-level default that needs no files, and Hugging Face ``tokenizer.json`` files.

Byte-level ids (:class:`ByteTokenizer`):

======  ==================================
0-255   the UTF-8 bytes themselves
256     ``<pad>`` (``pad_id``)
257     ``<bos>`` (``bos_id``)
258     ``<eos>`` (``eos_id``)
======  ==================================

so ``vocab_size`` is 259 and any text round-trips exactly. Models may have a larger (padded) vocabulary; the
extra rows are simply never used.

:func:`save_hf_tokenizer` writes any of them as the ``tokenizer.json`` and ``tokenizer_config.json`` that
transformers' ``AutoTokenizer`` and vLLM load. The byte-level one becomes a byte-level BPE without merges, with
the same ids; as in every Hugging Face tokenizer, text that spells a special token (``<eos>``) then reads as that
token.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path

from tokenizers import Tokenizer as _HF
from tokenizers import decoders, models, pre_tokenizers

from latentloop.errors import UsageError
from latentloop.io import atomic_write_text


class Tokenizer(ABC):
    """Text <-> token ids. ``eos_id`` ends a document or an answer, ``pad_id`` fills fixed-length batches."""

    name: str = ""
    vocab_size: int
    eos_id: int
    pad_id: int
    bos_id: int | None = None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens are dropped."""

    def token_text(self, token_id: int) -> str:
        """One token's text, a special token's spelling where it decodes to nothing (``<eos>``)."""
        return self.decode([token_id]) or f"<{token_id}>"

    @abstractmethod
    def hf_tokenizer(self, vocab_size: int | None = None) -> _HF:
        """The same tokenizer as a ``tokenizers.Tokenizer`` (what a ``tokenizer.json`` holds); ``vocab_size``
        pads it with unused special tokens up to a model's padded vocabulary."""


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255, then ``<pad>`` 256, ``<bos>`` 257, ``<eos>`` 258 (see the module docstring)."""

    name = "byte"
    PAD, BOS, EOS = 256, 257, 258

    def __init__(self) -> None:
        self.vocab_size = 259
        self.pad_id, self.bos_id, self.eos_id = self.PAD, self.BOS, self.EOS

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text (invalid UTF-8 sequences become U+FFFD); ids >= 256 are dropped."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        special = {self.PAD: "<pad>", self.BOS: "<bos>", self.EOS: "<eos>"}
        return special.get(token_id) or super().token_text(token_id)

    def hf_tokenizer(self, vocab_size: int | None = None) -> _HF:
        """A byte-level BPE without merges: each byte is its own token, under the id it has here."""
        tok = _HF(models.BPE(vocab={char: i for i, char in enumerate(byte_alphabet())}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        unused = [f"<unused_{i}>" for i in range(self.vocab_size, vocab_size or self.vocab_size)]
        tok.add_special_tokens(["<pad>", "<bos>", "<eos>", *unused])
        return tok


def byte_alphabet() -> list[str]:
    """The character that stands for each byte 0-255 in a byte-level ``tokenizer.json`` (GPT-2's map: the
    printable Latin-1 bytes stand for themselves, the others for the code points from 256 up, in byte order)."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    others = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(others)) for byte in range(256)]


# Common spellings of special tokens in published tokenizer.json files, most specific first.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|im_end|>")
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` package.

    ``eos_id`` is ``eos_token`` when given, else the first of the usual end-of-text tokens the vocabulary has
    (``<|endoftext|>``, ``</s>``, ...); ``pad_id`` is a pad token if there is one, else ``eos_id``.
    """

    def __init__(self, path: str | Path, eos_token: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise UsageError(f"tokenizer file {path} does not exist")
        try:
            json.loads(path.read_text(encoding="utf-8"))
            self._tok = _HF.from_file(str(path))
        except Exception as error:  # json, OS and the tokenizers parser (which raises plain Exception)
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UsageError(f"tokenizer file {path} is not a valid tokenizer.json: {message}") from None
        self.name = str(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        eos = self._find((eos_token,) if eos_token else _EOS_NAMES)
        if eos is None:
            wanted = eos_token or ", ".join(_EOS_NAMES)
            raise UsageError(f"tokenizer {path} has no end-of-text token (looked for {wanted})")
        self.eos_id = eos
        pad = self._find(_PAD_NAMES)
        self.pad_id = eos if pad is None else pad
        self.bos_id = self._find(_BOS_NAMES)

    def _find(self, names: tuple[str, ...]) -> int | None:
        for name in names:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without the tokenizer's post-processing specials."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id]) or self._tok.id_to_token(int(token_id)) or f"<{token_id}>"

    def hf_tokenizer(self, vocab_size: int | None = None) -> _HF:
        """The loaded file (a padded vocabulary's extra rows stay outside it, as the file has them)."""
        return self._tok


def load_tokenizer(spec: str | Path | None = None, eos_token: str | None = None) -> Tokenizer:
    """``None``, ``""`` or ``"byte"`` -> :class:`ByteTokenizer`; anything else is a ``tokenizer.json`` path (or a
    folder holding one)."""
    if spec is None or str(spec) in ("", "byte", "bytes"):
        return ByteTokenizer()
    return HFTokenizer(spec, eos_token=eos_token)


def save_hf_tokenizer(
    tokenizer: Tokenizer,
    folder: str | Path,
    vocab_size: int,
    max_length: int,
    chat_template: str | None = None,
) -> None:
    """Write ``tokenizer`` into ``folder`` as ``tokenizer.json`` and ``tokenizer_config.json``, the files that
    transformers' ``AutoTokenizer``, vLLM and latentloop load; ``vocab_size`` is the model's (padded) vocabulary,
    ``max_length`` its context, ``chat_template`` a Jinja template for chat requests."""
    folder = Path(folder)
    tok = tokenizer.hf_tokenizer(vocab_size)
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "eos_token": tok.id_to_token(tokenizer.eos_id),
        "pad_token": tok.id_to_token(tokenizer.pad_id),
    }
    if tokenizer.bos_id is not None:
        config["bos_token"] = tok.id_to_token(tokenizer.bos_id)
    if chat_template is not None:
        config["chat_template"] = chat_template
    atomic_write_text(folder / "tokenizer.json", tok.to_str())
    atomic_write_text(folder / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False))
