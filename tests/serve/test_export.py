"""``latentloop export``: a run becomes one folder with the same weights and the run's tokenizer, which generate,
serve's loader and the Hugging Face tokenizer files read back; bad input leaves nothing behind."""

from __future__ import annotations

import json

import pytest
import torch

from latentloop.cli import main
from latentloop.data.tokenizers import ByteTokenizer, HFTokenizer, load_tokenizer
from latentloop.infer.runs import lm_tokenizer
from latentloop.models.ouro import OuroLM
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.serve.export import chat_template_of
from latentloop.train.checkpoint import resolve_checkpoint
from latentloop.train.loop import train
from latentloop.train.run_config import build_run_config
from tests.data.test_tokenizers import _write_hf_tokenizer
from tests.models.test_ouro import tiny as tiny_ouro
from tests.tiny import TINY_LM, tiny_run


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("export") / "run"
    train(build_run_config(tiny_run(TINY_LM, train={"steps": 2})), run)
    return run


def test_an_exported_run_gives_the_same_logits_and_text(lm_run, tmp_path, capsys):
    out = tmp_path / "served"
    assert main(["export", str(lm_run), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []
    trained = RecurrentDepthLM.from_pretrained(resolve_checkpoint(lm_run)).eval()
    exported = RecurrentDepthLM.from_pretrained(out).eval()
    ids = torch.tensor([ByteTokenizer().encode("12+34=")])
    with torch.no_grad():
        assert torch.equal(
            trained(ids, num_steps=2, init_scale=0.0).logits,
            exported(ids, num_steps=2, init_scale=0.0).logits,
        )
    tok = lm_tokenizer(out)
    assert isinstance(tok, HFTokenizer) and (tok.eos_id, tok.pad_id, tok.bos_id) == (258, 256, 257)
    assert tok.vocab_size == trained.config.vocab_size  # padded to the model's 264 with unused specials
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == trained.config.block_size
    capsys.readouterr()
    texts = []
    for folder in (lm_run, out):
        argv = ["generate", str(folder), "12+34=", "--max-new-tokens", "6", "--init-scale", "0", "--json"]
        assert main(argv) == 0
        texts.append(json.loads(capsys.readouterr().out)["text"])
    assert texts[0] == texts[1]


def test_the_chat_template_goes_into_the_tokenizer_config(lm_run, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}={% endfor %}")
    out = tmp_path / "served"
    out.mkdir()  # an empty folder is taken
    assert main(["export", str(lm_run), "--out", str(out), "--chat-template", str(template)]) == 0
    assert chat_template_of(out) == template.read_text()


def test_a_text_run_exports_the_tokenizer_it_trained_with(tmp_path):
    path = _write_hf_tokenizer(tmp_path / "bpe.json", specials=("</s>",))
    task = {"name": "text", "seq_len": 16, "tokenizer": str(path)}
    config = {**tiny_run(TINY_LM, model={"vocab_size": 512}), "task": task}  # the task replaced whole
    run = tmp_path / "run"
    train(build_run_config(config, ["train.steps=1"]), run)
    assert isinstance(lm_tokenizer(resolve_checkpoint(run)), HFTokenizer)  # read from the run's config
    out = tmp_path / "served"
    assert main(["export", str(run), "--out", str(out)]) == 0
    exported, original = load_tokenizer(out), load_tokenizer(path)
    text = "the quick brown fox"
    assert exported.encode(text) == original.encode(text) and exported.eos_id == original.eos_id
    assert lm_tokenizer(out, ByteTokenizer().name).vocab_size == 259  # --tokenizer wins


def test_an_ouro_checkpoint_exports_in_its_layout(tmp_path):
    model = tiny_ouro(vocab=264).eval()
    model.save_pretrained(tmp_path / "ouro")
    assert main(["export", str(tmp_path / "ouro"), "--out", str(tmp_path / "served")]) == 0
    assert json.loads((tmp_path / "served" / "config.json").read_text())["model_type"] == "ouro"
    loaded = OuroLM.from_pretrained(tmp_path / "served")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_bad_input_exits_2_and_writes_nothing(lm_run, tmp_path, capsys, gram_run):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("")
    small = _write_hf_tokenizer(tmp_path / "big.json")  # about 300 ids, beyond the model's 264
    cases = [
        (["export", str(lm_run), "--out", str(taken)], "exists and is not an empty folder"),
        (["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "a")], "nowhere"),
        (["export", str(gram_run), "--out", str(tmp_path / "b")], "unknown model_type"),
        (
            ["export", str(lm_run), "--out", str(tmp_path / "c"), "--tokenizer", str(small)],
            "more than the model",
        ),
        (
            [
                "export",
                str(lm_run),
                "--out",
                str(tmp_path / "d"),
                "--chat-template",
                str(tmp_path / "none.jinja"),
            ],
            "does not exist",
        ),
        (
            ["quantize", str(lm_run), "--out", str(tmp_path / "e"), "--weights", "int4"],
            "weights must be one of int8",
        ),
        (["generate", str(lm_run), "1+1=", "--weights", "fp8"], "weights must be one of int8"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json", "taken"]
    assert [p.name for p in taken.iterdir()] == ["file"]


def test_a_quantized_run_decodes_as_the_run_with_int8_weights(lm_run, tmp_path, capsys):
    """`latentloop quantize` writes a folder that generate loads as it is: the tokens of `generate RUN
    --weights int8`, at a quarter of the weight bytes, with the run's tokenizer beside it."""
    out = tmp_path / "int8"
    assert main(["quantize", str(lm_run), "--out", str(out)]) == 0
    capsys.readouterr()
    assert {"quantization.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    floats = resolve_checkpoint(lm_run) / "model.safetensors"
    assert (
        out / "model.safetensors"
    ).stat().st_size < 0.35 * floats.stat().st_size  # norms and scales stay fp32
    texts = []
    for argv in (
        [str(out)],
        [str(lm_run), "--weights", "int8"],
        [str(out), "--compile"],
    ):
        assert main(["generate", *argv, "12+34=", "-n", "6", "-r", "3", "--init-scale", "0", "--json"]) == 0
        texts.append(json.loads(capsys.readouterr().out)["tokens"])
    assert texts[0] == texts[1]
    assert texts[2] == texts[0]  # the compiled single-row kernel keeps fp32 activations; this tiny run agrees
