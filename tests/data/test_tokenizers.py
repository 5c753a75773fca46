"""Byte-level and Hugging Face tokenizers."""

from __future__ import annotations

import json

import pytest

from latentloop.data.tokenizers import ByteTokenizer, HFTokenizer, load_tokenizer
from latentloop.errors import UsageError


def test_byte_tokenizer_ids_and_round_trip():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (259, 256, 257, 258)
    text = "347+589=0936\nnaïve — 数字"
    ids = tok.encode(text)
    assert ids[:4] == [ord("3"), ord("4"), ord("7"), ord("+")]
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text  # specials dropped


def _write_hf_tokenizer(path, specials=("<|endoftext|>", "<pad>")):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]", *specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer=trainer)
    tok.save(str(path))
    return path


def test_hf_tokenizer_from_file_and_folder(tmp_path):
    path = _write_hf_tokenizer(tmp_path / "tokenizer.json")
    for spec in (path, tmp_path):
        tok = load_tokenizer(spec)
        assert isinstance(tok, HFTokenizer)
        ids = tok.encode("the lazy fox")
        assert tok.decode(ids) == "the lazy fox"
        assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>")
        assert tok.pad_id == tok._tok.token_to_id("<pad>")
        assert tok.vocab_size >= max(ids) + 1


def test_hf_tokenizer_without_pad_pads_with_eos(tmp_path):
    tok = HFTokenizer(_write_hf_tokenizer(tmp_path / "t.json", specials=("</s>",)))
    assert tok.pad_id == tok.eos_id == tok._tok.token_to_id("</s>")


def test_hf_tokenizer_without_end_of_text_is_an_error(tmp_path):
    path = _write_hf_tokenizer(tmp_path / "t.json", specials=("<x>",))
    with pytest.raises(UsageError, match="end-of-text"):
        HFTokenizer(path)
    assert HFTokenizer(path, eos_token="<x>").eos_id is not None


def test_default_spec_is_byte_level():
    for spec in (None, "", "byte"):
        assert isinstance(load_tokenizer(spec), ByteTokenizer)


def test_missing_and_malformed_files_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(UsageError, match="does not exist"):
        load_tokenizer(tmp_path)  # a folder without tokenizer.json
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a valid tokenizer"):
        load_tokenizer(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"hello": 1}))
    with pytest.raises(UsageError, match="not a valid tokenizer") as info:
        load_tokenizer(wrong)
    assert "\n" not in str(info.value)


def test_token_text_spells_special_tokens_that_decode_to_nothing(tmp_path):
    byte = ByteTokenizer()
    assert [byte.token_text(i) for i in (97, 256, 257, 258)] == ["a", "<pad>", "<bos>", "<eos>"]
    tok = HFTokenizer(_write_hf_tokenizer(tmp_path / "t.json"))
    assert tok.token_text(tok.eos_id) == "<|endoftext|>"
    fox = tok.encode("fox")
    assert "".join(tok.token_text(i) for i in fox) == "fox"
