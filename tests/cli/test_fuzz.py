"""Fuzzing the command line's puzzle and config inputs: whatever comes in, no traceback; bad input is answered
with exit 2 and one ``error:`` line. Training itself is replaced by a stub, so that an input that happens to
be valid finishes at once instead of training."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latentloop.cli import main
from latentloop.train import loop

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
TASKS = st.one_of(
    st.sampled_from(
        ["sudoku", "nqueens", "graph-coloring", "sudoku:box=2", "nqueens:n=4", "arithmetic", "nope"]
    ),
    TEXT,
)
KEYS = st.sampled_from(
    [
        "train.lr",
        "train.batch_size",
        "train.steps",
        "train.precision",
        "train.device",
        "train.betas",
        "train.keep_checkpoints",
        "train.budget_minutes",
        "train.ema",
        "model.n_embd",
        "model.n_heads",
        "model.vocab_size",
        "model.mean_recurrence",
        "model.sampling_scheme",
        "model.dim",
        "task.name",
        "task.digits",
        "task.n",
        "arch",
        "nope",
        "train",
        "",
    ]
)
VALUES = st.one_of(
    TEXT,
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "[1, 2]", "{a: 1}", "null", "true", "fp8", "cuda:7", "1e-3", "0.9,0.95"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**4), 10**4), st.floats(), TEXT)
YAML_DATA = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(KEYS, st.sampled_from(["model", "task", "name", "lr"]), TEXT), inner, max_size=4
        ),
    ),
    max_leaves=12,
)


def run(argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of the command line run in this process (an exception fails the test)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def check_answer(code: int, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > len("error: "), err
    assert "Traceback" not in err


@pytest.fixture(autouse=True)
def stub_training(monkeypatch):
    """A config that passes validation 'trains' instantly; everything before the training loop is real."""

    def fake_train(config, out_dir, **_):
        return loop.TrainResult(Path(out_dir), 0, [], None, "steps", "fp32", 0.0, 0, {"tokens_seen": 0})

    monkeypatch.setattr(loop, "train", fake_train)


@FUZZ
@given(task=TASKS, puzzle=TEXT, n=st.one_of(st.none(), st.integers(-3, 12).map(str), TEXT))
def test_solve_any_puzzle_text(task, puzzle, n):
    argv = ["solve", task, puzzle, "--exact"] + ([] if n is None else ["--n", n])
    check_answer(*run(argv))


@FUZZ
@given(task=TASKS, puzzle=TEXT, answer=TEXT)
def test_check_any_answer_text(task, puzzle, answer):
    check_answer(*run(["check", task, puzzle, answer]))


@FUZZ
@given(
    overrides=st.lists(st.tuples(KEYS, VALUES).map("=".join), max_size=4),
    model=st.one_of(st.none(), st.sampled_from(["recurrent-depth", "trm", "gram", "nope"])),
)
def test_train_any_overrides(tmp_path_factory, overrides, model):
    out = tmp_path_factory.getbasetemp() / "never-written"
    argv = ["train", "--out", str(out), "-q", *overrides] + ([] if model is None else ["--model", model])
    check_answer(*run(argv))
    assert not out.exists()


@FUZZ
@given(data=YAML_DATA, raw=st.one_of(st.none(), TEXT))
def test_train_any_config_file(tmp_path_factory, data, raw):
    folder = tmp_path_factory.mktemp("yaml")
    config = folder / "run.yaml"
    config.write_text(yaml.safe_dump(data) if raw is None else raw, encoding="utf-8")
    check_answer(*run(["train", "--config", str(config), "--out", str(folder / "out"), "-q"]))
    assert not (folder / "out").exists()
