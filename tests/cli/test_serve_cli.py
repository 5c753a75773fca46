"""``latentloop serve`` refuses bad options with one line and exit 2, before it loads or listens."""

from __future__ import annotations

import pytest
import torch

from latentloop.cli import main
from latentloop.models.recurrent_depth import RecurrentDepthLM
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("served") / "model"
    RecurrentDepthLM(tiny_config(vocab_size=259)).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-batch", "0"], "--max-batch must be at least 1"),
        (["--kv-share", "0"], "--kv-share must be at least 1"),
        (["--init-scale", "-1"], "--init-scale must be >= 0"),
        (["--chat-template", "missing.jinja"], "chat template file missing.jinja does not exist"),
    ],
)
def test_bad_options_exit_2_with_one_line(folder, capsys, options, message):
    assert main(["serve", str(folder), *options]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_a_missing_model_exits_2(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
