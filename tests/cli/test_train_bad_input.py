"""``latentloop train`` on a damaged run folder, a run folder of another model, or an impossible config: one
``error:`` line, exit 2, and nothing in the run folder changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from latentloop.cli import main
from latentloop.train.checkpoint import latest_checkpoint
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config, build_run_config
from tests.tiny import TINY_LM, TINY_REASONER, tiny_run

LM = tiny_run(TINY_LM, train={"steps": 2, "eval_size": 0})
REASONER = tiny_run(
    TINY_REASONER,
    arch="trm",
    model={"n_sup": 1, "cycles": 1, "inner": 1},
    train={"batch_size": 4, "steps": 1, "eval_size": 0},
)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _train(capsys, config: Path, out: Path, *extra: str) -> str:
    code = main(["train", "--config", str(config), "--out", str(out), "-q", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "run"
    train(build_run_config(LM), out)
    return out


@pytest.fixture
def lm_config(tmp_path):
    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump({**LM, "train": {**LM["train"], "steps": 4}}))
    return path


def _damaged_copy(lm_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(lm_run, out)
    return out, latest_checkpoint(out)


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        ("model.safetensors", "truncate", "model.safetensors"),
        ("model.safetensors", "garbage", "model.safetensors"),
        ("optimizer.pt", "truncate", "corrupt: optimizer.pt"),
        ("optimizer.pt", "garbage", "corrupt: optimizer.pt"),
        ("trainer_state.json", "truncate", "corrupt: trainer_state.json"),
        ("config.json", "garbage", "config.json"),
    ],
)
def test_a_damaged_checkpoint_is_one_line_and_changes_nothing(
    lm_run, lm_config, tmp_path, capsys, file, damage, message
):
    out, checkpoint = _damaged_copy(lm_run, tmp_path)
    data = (checkpoint / file).read_bytes()
    (checkpoint / file).write_bytes(
        data[: len(data) // 2] if damage == "truncate" else b"\x80\x02garbage" * 9
    )
    before = _snapshot(out)
    line = _train(capsys, lm_config, out)
    assert message in line
    assert _snapshot(out) == before


def test_a_checkpoint_of_another_model_is_refused(tmp_path, lm_config, capsys):
    out = tmp_path / "puzzle"
    train(build_reasoner_config(REASONER), out)
    before = _snapshot(out)
    _train(capsys, lm_config, out)
    assert _snapshot(out) == before


def test_a_checkpoint_of_another_size_is_refused(lm_run, lm_config, tmp_path, capsys):
    out, _ = _damaged_copy(lm_run, tmp_path)
    before = _snapshot(out)
    assert "model.n_embd=32" in _train(capsys, lm_config, out, "model.n_embd=64")
    assert _snapshot(out) == before


@pytest.mark.parametrize(
    "override",
    [
        "train.batch_size=0",
        "train.lr=-1",
        "train.steps=many",
        "train.precision=fp8",
        "model.vocab_size=3",
        "train.keep_checkpoints=[1]",
        "task.digits=-2",
        "train.decay_fraction=0",
    ],
)
def test_an_impossible_config_value_writes_nothing(lm_config, tmp_path, capsys, override):
    out = tmp_path / "fresh"
    _train(capsys, lm_config, out, override)
    assert not out.exists()


def test_a_config_file_that_is_not_a_mapping(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("- just\n- a list\n")
    _train(capsys, config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["", "\n# only a comment\n"])
def test_an_empty_config_file_is_refused_rather_than_run_with_every_default(tmp_path, capsys, text):
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    assert "is empty: it must hold a mapping of settings" in _train(capsys, config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps", "1", "train.steps=-5"], "train.steps is set twice, to -5 and to 1: give it once"),
        (["train.lr=1e-3", "train.lr=2e-3"], "train.lr is set twice, to 1e-3 and to 2e-3: give it once"),
        # A control character is quoted, so the message stays on one line.
        (["train.lr=", "train.lr=0\r0"], "train.lr is set twice, to  and to '0\\r0': give it once"),
        (["--steps", "-5"], "train.steps must not be negative, got -5"),
        (["train.steps=-5"], "train.steps must not be negative, got -5"),
    ],
)
def test_a_key_set_twice_or_a_negative_count_is_named_and_writes_nothing(
    lm_config, tmp_path, capsys, extra, message
):
    out = tmp_path / "fresh"
    assert message in _train(capsys, lm_config, out, *extra)
    assert not out.exists()


@pytest.mark.parametrize(
    "override",
    [
        "train.curriculum=[{until: 0.6}, {until: 0.3}]",
        "train.curriculum=[{until: 0.5, cycles: 0}]",
        "train.curriculum=[{until: 0.5, depth: 2}]",
        "train.curriculum=5",
        "train.step_weight_decay=1.5",
        "train.validation=-1",
        "train.validation=100000",
        "model.rope_grid=-1",
        "model.rope_grid=1000",  # wider than the task's sequence: no whole rows
        "model.pos_encoding=absolute",
    ],
)
def test_a_bad_curriculum_or_step_weight_is_one_line_and_writes_nothing(tmp_path, capsys, override):
    config = tmp_path / "reasoner.yaml"
    config.write_text(yaml.safe_dump(REASONER))
    out = tmp_path / "fresh"
    line = _train(capsys, config, out, override)
    keys = (
        "train.curriculum",
        "train.step_weight_decay",
        "validation",
        "model.rope_grid",
        "model.pos_encoding",
    )
    assert any(key in line for key in keys)
    assert not out.exists()
