"""Official TinyRecursiveModels/HRM checkpoints convert into latentloop models that compute the same thing.

The fixtures (``fixtures/official/*.safetensors``) hold weights, a batch and the outputs of 16 ACT training
steps made by the official code (``benchmarks/compare_trm_hrm_reference.py --fixture``); they are data, and
the official code is not needed here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from latentloop.cli import main
from latentloop.convert import act_rollout, official_reasoner, official_state_dict, read_official_config
from latentloop.errors import UsageError
from latentloop.models.reasoners import ReasonerConfig, build_reasoner, load_reasoner
from latentloop.models.reasoners.base import swiglu_width, truncated_normal_

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "official").glob("*.safetensors"))
FIXTURE = {path.stem: path for path in FIXTURES}
CARRY = {"trm": {"z_H": "y", "z_L": "z"}, "hrm": {"z_H": "z_H", "z_L": "z_L"}}


def read_fixture(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    with safe_open(str(path), "pt") as file:
        return file.metadata(), {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118


def official_weights(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("official."): v for k, v in tensors.items() if k.startswith("official.")}


def test_the_fixtures_cover_attention_mlp_t_and_hrm_with_each_position_encoding() -> None:
    assert sorted(FIXTURE) == [
        "hrm",
        "hrm-learned",
        "hrm-none",
        "trm-attention",
        "trm-attention-learned",
        "trm-attention-none",
        "trm-mlp_t",
        "trm-mlp_t-learned",
        "trm-mlp_t-none",
    ]
    # TRM's best Sudoku-Extreme model (87.4%) is mlp_t without position encodings
    famous = json.loads(read_fixture(FIXTURE["trm-mlp_t-none"])[0]["arch"])
    assert famous["mlp_t"] and famous["pos_encodings"] == "none"


def official_records(
    tensors: dict[str, torch.Tensor], kind: str, steps: int
) -> list[dict[str, torch.Tensor]]:
    """The official run's outputs after each step, under the names of :func:`act_rollout`'s records."""
    records = []
    for step in range(steps):
        expected = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"step{step}.")}
        for official, mine in CARRY[kind].items():
            expected[f"carry.{mine}"] = expected.pop(f"carry.{official}")
        records.append(expected)
    return records


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_converted_models_match_the_official_code_at_every_supervision_step(path: Path) -> None:
    meta, tensors = read_fixture(path)
    kind, arch = meta["kind"], json.loads(meta["arch"])
    model = official_reasoner(kind, official_weights(tensors), arch, seq_len=int(meta["seq_len"]))
    batch = {"inputs": tensors["batch.inputs"], "puzzle_ids": tensors["batch.puzzle_ids"]}
    labels = tensors["batch.labels"]
    expected = official_records(tensors, kind, arch["halt_max_steps"])
    with torch.no_grad():
        records = act_rollout(model, batch, labels, len(expected), reference=expected)
    names = ("logits", "q_halt", "q_continue", "loss", *(f"carry.{mine}" for mine in CARRY[kind].values()))
    # One ACT step runs the core 8 times (2 H cycles of 3 L steps and one H) on values of size ~3: kernels
    # that round differently part them by up to 3e-5 within it; a wrong equation moves them by ~1.
    for step, (record, official) in enumerate(zip(records, expected, strict=True)):
        for name in names:
            torch.testing.assert_close(record[name], official[name], atol=1e-4, rtol=0, msg=f"{name} {step}")
        assert torch.equal(record["halted"], official["halted"]), f"halting differs at step {step}"
    halted_early = sum(int(official["halted"].sum()) for official in expected[:-1])
    assert halted_early > 0  # the fixture exercises halting and the restart of halted samples

    # Left to itself, the rollout follows the official one while rounding is still small: its first two steps.
    with torch.no_grad():
        free = act_rollout(model, batch, labels, 2)
    for step, (record, official) in enumerate(zip(free, expected, strict=False)):
        torch.testing.assert_close(
            record["logits"], official["logits"], atol=1e-3, rtol=0, msg=f"free {step}"
        )
        assert torch.equal(record["halted"], official["halted"]), (
            f"free rollout: halting differs at step {step}"
        )


def test_a_saved_file_with_the_compiled_prefix_loads_the_same_model(tmp_path: Path) -> None:
    meta, tensors = read_fixture(FIXTURE["trm-attention"])
    weights = official_weights(tensors)
    assert all(key.startswith("_orig_mod.model.inner.") for key in weights)
    plain = {key.removeprefix("_orig_mod."): value for key, value in weights.items()}
    torch.save(plain, tmp_path / "step_10")
    arch = json.loads(meta["arch"])
    a = official_reasoner("trm", weights, arch, seq_len=9).state_dict()
    b = official_reasoner("trm", tmp_path / "step_10", arch, seq_len=9).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def official_layout_trm(**changes) -> torch.nn.Module:
    config = {
        "vocab_size": 3,
        "seq_len": 16,
        "dim": 16,
        "n_heads": 2,
        "n_layers": 1,
        "expansion": 2,
        "norm_weight": False,
        "rope_layout": "halves",
        "n_sup": 2,
        "cycles": 1,
        "inner": 2,
    }
    return build_reasoner("trm", ReasonerConfig(**(config | changes)))


TRM_ARCH = {
    "name": "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",
    "loss": {"name": "losses@ACTLossHead", "loss_type": "stablemax_cross_entropy"},
    "halt_exploration_prob": 0.1,
    "halt_max_steps": 2,
    "H_cycles": 1,
    "L_cycles": 2,
    "H_layers": 0,
    "L_layers": 1,
    "hidden_size": 16,
    "num_heads": 2,
    "expansion": 2,
    "puzzle_emb_ndim": 0,
    "puzzle_emb_len": 0,
    "pos_encodings": "rope",
    "mlp_t": False,
    "no_ACT_continue": True,
}


@pytest.mark.parametrize("mixer", ["attention", "mlp-t"])
@pytest.mark.parametrize("positions", ["rope", "learned", "none"])
def test_official_state_dict_is_the_inverse_of_the_conversion(mixer: str, positions: str) -> None:
    model = official_layout_trm(mixer=mixer, pos_encoding=positions)
    official = official_state_dict(model)
    assert ("model.inner.embed_pos.embedding_weight" in official) == (positions == "learned")
    arch = TRM_ARCH | {"mlp_t": mixer == "mlp-t", "pos_encodings": positions}
    converted = official_reasoner("trm", official, arch, seq_len=16)
    assert converted.config.pos_encoding == positions and converted.config.mixer == mixer
    back, mine = converted.state_dict(), model.state_dict()
    assert back.keys() == mine.keys()
    assert all(torch.equal(back[k], mine[k]) for k in mine if not k.startswith("value_head."))


def test_only_the_official_position_encodings_have_an_official_state_dict() -> None:
    with pytest.raises(UsageError, match="official layout"):
        official_state_dict(official_layout_trm(pos_encoding="rope+learned"))


def test_the_input_embedding_follows_the_official_arithmetic() -> None:
    """The official ``_input_embeddings``: ``sqrt(dim) * (0.707106781 * (tokens + positions))``, the puzzle
    prefix zero-padded before the tokens. At width 24 its scale rounds, so only that order gives the official
    numbers to the last bit."""
    model = official_layout_trm(
        dim=24, pos_encoding="learned", puzzles=2, puzzle_tokens=2, puzzle_dim=16, init="lecun"
    )
    with torch.no_grad():
        model.puzzle_embed.weight.normal_()
    inputs, puzzle_ids = torch.randint(0, 3, (5, 16)), torch.tensor([0, 1, 1, 0, 1])
    embedded, rope = model.embed_input(inputs, puzzle_ids)
    prefix = torch.nn.functional.pad(model.puzzle_embed(puzzle_ids), (0, 2 * 24 - 16)).view(5, 2, 24)
    official = torch.cat([prefix, model.embed(inputs)], dim=1)
    official = math.sqrt(24) * (0.707106781 * (official + model.pos_embed.weight))
    assert rope is None and torch.equal(embedded, official)
    none = official_layout_trm(pos_encoding="none", mixer="mlp-t")
    embedded, rope = none.embed_input(inputs)
    assert none.pos_embed is None and rope is None
    assert torch.equal(embedded, math.sqrt(16) * none.embed(inputs))


def test_convert_takes_trms_best_sudoku_configuration(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """TRM's README trains its best Sudoku-Extreme model with ``arch.mlp_t=True arch.pos_encodings=none``."""
    model = official_layout_trm(mixer="mlp-t", pos_encoding="none")
    torch.save(official_state_dict(model), tmp_path / "step_100")
    arch = TRM_ARCH | {"mlp_t": True, "pos_encodings": "none"}
    (tmp_path / "all_config.yaml").write_text(json.dumps({"arch": arch, "lr": 1e-4}))
    out = tmp_path / "converted"
    args = ["convert", "trm", str(tmp_path / "step_100"), "--config", str(tmp_path / "all_config.yaml")]
    assert main([*args, "--out", str(out)]) == 0  # mlp_t's weights give the sequence length
    loaded = load_reasoner(out)
    assert loaded.config.pos_encoding == "none" and loaded.config.mixer == "mlp-t"
    mine = {k: v for k, v in model.state_dict().items() if not k.startswith("value_head.")}
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in mine.items())
    capsys.readouterr()
    (tmp_path / "all_config.yaml").write_text(json.dumps({"arch": arch | {"pos_encodings": "alibi"}}))
    assert main([*args, "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_refusals_name_the_problem_in_one_line(tmp_path: Path) -> None:
    weights = official_state_dict(official_layout_trm())
    torch.save({"model": weights, "step": 3}, tmp_path / "nested")
    with pytest.raises(UsageError, match="not a plain state dict"):
        official_reasoner("trm", tmp_path / "nested", TRM_ARCH, seq_len=16)
    torch.save(
        {"weights": torch.zeros(1), "rng": Path("x")}, tmp_path / "pickled"
    )  # an object weights_only refuses
    with pytest.raises(UsageError, match="not a plain state dict"):
        official_reasoner("trm", tmp_path / "pickled", TRM_ARCH, seq_len=16)
    with pytest.raises(UsageError, match="does not exist"):
        official_reasoner("trm", tmp_path / "missing", TRM_ARCH, seq_len=16)
    with pytest.raises(UsageError, match="not an official HRM"):
        official_reasoner("hrm", weights, TRM_ARCH, seq_len=16)
    with pytest.raises(UsageError, match="give --seq-len"):
        official_reasoner("trm", weights, TRM_ARCH)
    with pytest.raises(UsageError, match="has shape"):
        official_reasoner("trm", weights, TRM_ARCH | {"expansion": 25}, seq_len=16)
    with pytest.raises(UsageError, match="does not have"):
        official_reasoner("trm", weights | {"model.inner.extra.weight": torch.zeros(1)}, TRM_ARCH, seq_len=16)
    with pytest.raises(UsageError, match=r"lacks net\.layers\.1"):
        official_reasoner("trm", weights, TRM_ARCH | {"L_layers": 2}, seq_len=16)
    with pytest.raises(UsageError, match=r"no puzzle_emb\.weights"):
        official_reasoner("trm", weights, TRM_ARCH | {"puzzle_emb_ndim": 16, "puzzle_emb_len": 1}, seq_len=16)
    with pytest.raises(UsageError, match=r"no L_level\.layers\.0\.mlp_t"):
        official_reasoner("trm", weights, TRM_ARCH | {"mlp_t": True}, seq_len=16)
    with pytest.raises(UsageError, match="'sincos' is not an official option"):
        official_reasoner("trm", weights, TRM_ARCH | {"pos_encodings": "sincos"}, seq_len=16)
    with pytest.raises(UsageError, match=r"lacks pos_embed\.weight"):
        official_reasoner("trm", weights, TRM_ARCH | {"pos_encodings": "learned"}, seq_len=16)


def test_architecture_yaml_references_to_a_sibling_key_are_resolved(tmp_path: Path) -> None:
    (tmp_path / "trm.yaml").write_text("name: x\nhidden_size: 512\npuzzle_emb_ndim: ${.hidden_size}\n")
    assert read_official_config(tmp_path / "trm.yaml")["puzzle_emb_ndim"] == 512
    (tmp_path / "all_config.yaml").write_text("lr: 1.0e-4\narch:\n  name: y\n  hidden_size: 8\n")
    assert read_official_config(tmp_path / "all_config.yaml") == {"name": "y", "hidden_size": 8}


def test_the_official_options_build_the_official_shapes() -> None:
    assert swiglu_width(4, 512) == 1536 and swiglu_width(4, 97) == 512 and swiglu_width(2, 16) == 256
    model = official_layout_trm(mixer="mlp-t", puzzles=2, puzzle_tokens=3, puzzle_dim=16, init="lecun")
    state = model.state_dict()
    assert state["net.layers.0.mix.fc.weight"].shape == (2 * 256, 19)  # 16 positions and 3 of prefix
    assert state["puzzle_embed.weight"].shape == (2, 16)
    assert not any("norm" in key for key in state)
    assert model.config.hidden == 256
    # The learned position table starts as the official one: truncated LeCun-normal, within two (uncorrected)
    # deviations of 1/sqrt(16)
    learned = official_layout_trm(pos_encoding="learned", init="lecun").pos_embed.weight
    assert float(learned.abs().max()) <= 2 * 0.25 / 0.8796 + 1e-6
    for key, value in {"mixer": "conv", "rope_layout": "spiral", "init": "xavier", "expansion": -1}.items():
        with pytest.raises(UsageError, match=f"model.{key}"):
            official_layout_trm(**{key: value})


def test_truncated_normal_has_the_standard_deviation_it_is_asked_for() -> None:
    torch.manual_seed(0)
    sample = truncated_normal_(torch.empty(200_000), std=0.5)
    assert abs(float(sample.std()) - 0.5) < 0.005
    assert float(sample.abs().max()) <= 2 * 0.5 / 0.8796 + 1e-6  # two (uncorrected) deviations


def test_convert_writes_a_run_that_eval_and_train_take(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = official_layout_trm()
    torch.save(official_state_dict(model), tmp_path / "step_100")
    (tmp_path / "arch.yaml").write_text(json.dumps(TRM_ARCH))
    run = tmp_path / "run"
    args = ["convert", "trm", str(tmp_path / "step_100"), "--config", str(tmp_path / "arch.yaml")]
    overrides = ["train.batch_size=8", "train.steps=2", "train.eval_size=4", "train.device=cpu"]
    assert main([*args, "--out", str(run), "--task", "nqueens:n=4", *overrides]) == 0
    saved = load_file(str(run / "checkpoints" / "step_00000000" / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items() if not k.startswith("value_"))
    assert main(["eval", str(run), "--samples", "2", "--limit", "4"]) == 0
    assert main(["train", "--config", str(run / "config.yaml"), "--out", str(run)]) == 0
    assert (run / "checkpoints" / "step_00000002").is_dir()
    capsys.readouterr()
    # An existing folder is not overwritten, and a failed conversion leaves nothing behind.
    assert main([*args, "--out", str(run), "--task", "nqueens:n=4"]) == 2
    assert main([*args, "--out", str(tmp_path / "bad"), "--task", "sudoku:n=4"]) == 2
    assert not (tmp_path / "bad").exists()
    assert "does not fit task" in capsys.readouterr().err
