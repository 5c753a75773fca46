"""The training compute a run records: its FLOPs count against ``torch.utils.flop_counter.FlopCounterMode``
on the same training batch, within 10%, for every model family and halting scheme."""

from __future__ import annotations

import json

import pytest
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from latentloop.train.checkpoint import read_trainer_state
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config, build_run_config
from tests.tiny import TINY_LM, TINY_REASONER, tiny_run

ONE_BATCH = {"steps": 1, "batch_size": 32, "eval_size": 0}


def _measured(config, out):
    # The math kernel of attention runs as matrix products that FlopCounterMode counts; the fused CPU kernel
    # is not counted by it at all.
    with FlopCounterMode(display=False) as reference, sdpa_kernel(SDPBackend.MATH):
        result = train(config, out)
    return result, reference.get_total_flops()


@pytest.mark.parametrize(
    "arch, model, extra",
    [
        ("gram", {}, {}),
        ("trm", {}, {"replace_halted": True}),
        ("hrm", {"halting": "q-learning"}, {}),  # its look-ahead forward counts too
        ("looped", {}, {}),
        ("ar", {"n_sup": 1}, {}),
    ],
)
def test_reasoner_flops_match_the_torch_count(tmp_path, arch, model, extra):
    config = build_reasoner_config(
        tiny_run(TINY_REASONER, arch=arch, model=model, train={**ONE_BATCH, **extra})
    )
    result, reference = _measured(config, tmp_path / "run")
    assert result.counts["flops"] == pytest.approx(reference, rel=0.1)
    # The run's total is in its metrics and its checkpoint.
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["flops"] == result.counts["flops"]
    assert read_trainer_state(result.checkpoint)["flops"] == result.counts["flops"]


def test_language_model_flops_match_the_torch_count(tmp_path):
    config = build_run_config(tiny_run(TINY_LM, train=ONE_BATCH))
    result, reference = _measured(config, tmp_path / "run")
    assert result.counts["flops"] == pytest.approx(reference, rel=0.1)


def test_deeper_recursion_costs_more(tmp_path):
    def flops(cycles):
        model = {"cycles": cycles, "inner": 1}
        config = build_reasoner_config(tiny_run(TINY_REASONER, arch="trm", model=model, train=ONE_BATCH))
        return train(config, tmp_path / f"c{cycles}").counts["flops"]

    shallow, deep = flops(1), flops(3)
    # T transitions of (inner + 1) passes each, gradient through the last only: 3 * 2 against 3 * 2 + 2 * 2
    # passes' worth, plus the same embedding and heads.
    assert 1.5 < deep / shallow < 10 / 6
