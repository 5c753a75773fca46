"""Byte-level and Hugging Face tokenizers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from latentloop.data.tokenizers import (
    ByteTokenizer,
    HFTokenizer,
    byte_alphabet,
    load_tokenizer,
    save_hf_tokenizer,
)
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


# As tokenizer.json files ------------------------------------------------------------------------------------
SPELLED_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unused_")


@settings(max_examples=200, deadline=None)
@given(st.text().filter(lambda text: not any(name in text for name in SPELLED_SPECIALS)))
def test_byte_tokenizer_json_encodes_every_text_to_the_same_ids(text):
    saved = ByteTokenizer().hf_tokenizer(264)
    assert saved.encode(text, add_special_tokens=False).ids == list(text.encode("utf-8"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 263), max_size=40))
def test_byte_tokenizer_json_decodes_every_id_list_to_the_same_text(ids):
    # invalid UTF-8 too: both replace each broken sequence with one U+FFFD
    saved = ByteTokenizer().hf_tokenizer(264)
    assert saved.decode(ids, skip_special_tokens=True) == ByteTokenizer().decode(ids)


def test_byte_tokenizer_json_ids_of_the_special_tokens_and_the_padded_vocabulary():
    saved = ByteTokenizer().hf_tokenizer(264)
    assert [saved.token_to_id(name) for name in ("<pad>", "<bos>", "<eos>")] == [256, 257, 258]
    assert saved.get_vocab_size() == 264 and saved.id_to_token(263) == "<unused_263>"
    assert ByteTokenizer().hf_tokenizer().get_vocab_size() == 259
    assert byte_alphabet()[ord("a")] == "a" and byte_alphabet()[ord(" ")] == "Ġ"  # GPT-2's map
    assert len(set(byte_alphabet())) == 256
    # Text that spells a special token reads as that token, as in every Hugging Face tokenizer.
    assert saved.encode("1<eos>", add_special_tokens=False).ids == [ord("1"), 258]


def test_saved_tokenizer_files_load_back_as_the_same_tokenizer(tmp_path):
    save_hf_tokenizer(ByteTokenizer(), tmp_path, vocab_size=264, max_length=64, chat_template="{{ x }}")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 64,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "bos_token": "<bos>",
        "chat_template": "{{ x }}",
    }
    loaded = load_tokenizer(tmp_path)
    assert (loaded.eos_id, loaded.pad_id, loaded.bos_id, loaded.vocab_size) == (258, 256, 257, 264)
    text = "12+34=046\nnaïve — 数字"
    assert loaded.encode(text) == ByteTokenizer().encode(text)
    assert loaded.decode([257, *loaded.encode(text), 258, 260]) == text
    # A Hugging Face tokenizer is written as it is, its specials named by its own spelling.
    path = _write_hf_tokenizer(tmp_path / "bpe.json", specials=("</s>",))
    save_hf_tokenizer(load_tokenizer(path), tmp_path / "hf", vocab_size=512, max_length=32)
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["pad_token"], "bos_token" in config) == ("</s>", "</s>", False)
    assert (tmp_path / "hf" / "tokenizer.json").read_text() == Tokenizer.from_file(str(path)).to_str()
