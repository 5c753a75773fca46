"""The autoregressive baseline: shapes, cached decoding, sampling, checkpoints, training and eval through solve."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.infer.scaling import solve
from latentloop.models.reasoners import ARReasoner, ReasonerConfig, build_reasoner, load_reasoner
from latentloop.tasks.base import get_task
from latentloop.train.deep_supervision import supervision_loss
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_GENERATIVE

TASK = get_task("nqueens", n=4)


def tiny(block: str = "post-norm", **overrides) -> ARReasoner:
    torch.manual_seed(0)
    config = dict(vocab_size=TASK.vocab_size, seq_len=TASK.seq_len, dim=16, n_heads=2, n_layers=2, hidden=32)
    model = build_reasoner("ar", ReasonerConfig(block=block, n_sup=1, **{**config, **overrides}))
    return model.eval()


def inputs(size: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        1, TASK.vocab_size, (size, TASK.seq_len), generator=torch.Generator().manual_seed(seed)
    )


def test_teacher_forcing_shapes_and_loss_is_the_next_token_ce():
    model = tiny()
    x, y = inputs(), inputs(seed=1)
    carry, out = model(model.initial_carry({"inputs": x}), {"inputs": x}, target=y)
    assert carry == {}
    assert out.logits.shape == (3, TASK.seq_len, TASK.vocab_size) and out.loss.shape == (3,)
    assert out.halt_logit.shape == out.value.shape == out.kl.shape == (3,)
    log_probs = torch.log_softmax(out.logits, -1).gather(-1, y[..., None])[..., 0]
    assert torch.allclose(out.loss, -log_probs.mean(-1), atol=1e-6)


def test_an_output_token_sees_only_the_input_and_the_tokens_before_it():
    model = tiny()
    x, y = inputs(size=1), inputs(size=1, seed=1)
    _, out = model({}, {"inputs": x}, target=y)
    changed = y.clone()
    changed[0, 5] = 3 - changed[0, 5]  # flip empty <-> queen at output position 5
    _, other = model({}, {"inputs": x}, target=changed)
    # logits[i] predicts y_i from y_<i: positions up to 5 cannot see the change, position 6 on can.
    assert torch.equal(out.logits[:, :6], other.logits[:, :6])
    assert not torch.allclose(out.logits[:, 6:], other.logits[:, 6:])


@pytest.mark.parametrize("block", ["post-norm", "pre-norm", "sandwich"])
def test_decoding_with_the_kv_cache_equals_decoding_without(block):
    model = tiny(block)
    x = inputs(size=4)
    greedy_cached, lp_cached = model.decode(x, temperature=0.0, use_cache=True)
    greedy_full, lp_full = model.decode(x, temperature=0.0, use_cache=False)
    assert torch.equal(greedy_cached, greedy_full)
    assert torch.allclose(lp_cached, lp_full, atol=1e-5)
    torch.manual_seed(7)
    sampled_cached, _ = model.decode(x, temperature=1.0, use_cache=True)
    torch.manual_seed(7)
    sampled_full, _ = model.decode(x, temperature=1.0, use_cache=False)
    assert torch.equal(sampled_cached, sampled_full)


def test_greedy_decoding_agrees_with_the_teacher_forced_pass_on_its_own_tokens():
    model = tiny()
    x = inputs()
    tokens, log_probs = model.decode(x, temperature=0.0)
    _, out = model({}, {"inputs": x}, target=tokens)
    assert torch.equal(out.logits.argmax(-1), tokens)
    assert torch.allclose(torch.log_softmax(out.logits, -1).max(-1).values, log_probs, atol=1e-5)
    _, without_target = model({}, {"inputs": x})  # forward without a target decodes greedily
    assert torch.equal(without_target.logits.argmax(-1), tokens)


def test_samples_from_one_input_differ_and_greedy_ones_do_not():
    model = tiny()
    x = inputs(size=1).repeat(8, 1)
    torch.manual_seed(0)
    tokens, values = model.sample(x, temperature=1.0)
    assert tokens.shape == (1, 8, TASK.seq_len) and values.shape == (1, 8)
    assert len({tuple(t.tolist()) for t in tokens[0]}) > 1
    assert ((values > 0) & (values <= 1)).all()
    greedy, _ = model.sample(x, temperature=0.0)
    assert (greedy[0] == greedy[0, :1]).all()
    with pytest.raises(UsageError, match="steps must be 1"):
        model.sample(x, steps=4)


def test_solve_dispatches_to_the_sampler():
    model = tiny()
    x = inputs(size=2)
    torch.manual_seed(0)
    result = solve(model, x, samples=5, select="value")
    assert result.predictions.shape == (1, 5, 2, TASK.seq_len) and result.values.shape == (1, 5, 2)
    assert (result.halted_at == 1).all()
    best = result.values[-1].argmax(0)
    assert torch.equal(result.chosen, result.predictions[-1, best, torch.arange(2)])
    greedy = solve(model, x, samples=2, temperature=0.0)
    assert torch.equal(greedy.predictions[0, 0], model.decode(x, temperature=0.0)[0])


def test_save_and_load_give_the_same_logits(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path)
    loaded = load_reasoner(tmp_path).eval()
    assert isinstance(loaded, ARReasoner)
    x, y = inputs(), inputs(seed=1)
    assert torch.equal(
        model({}, {"inputs": x}, target=y)[1].logits, loaded({}, {"inputs": x}, target=y)[1].logits
    )


def test_the_trainer_uses_the_models_own_loss():
    model = tiny()
    x, y = inputs(), inputs(seed=1)
    _, out = model({}, {"inputs": x}, target=y)
    tc = build_reasoner_config({}, arch="ar").train
    tc.halt_weight = tc.value_weight = 0.0
    loss, parts = supervision_loss(out, y, 0.0, tc)
    assert torch.allclose(loss, out.loss.mean()) and parts["ce"] == pytest.approx(
        float(out.loss.mean().detach())
    )


def test_a_tiny_training_run_lowers_the_loss_and_evaluates(tmp_path, capsys):
    result = train(build_reasoner_config(TINY_GENERATIVE, arch="ar"), tmp_path / "run")
    assert len(result.losses) == 30  # n_sup = 1: one loss per batch
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5
    assert result.last_eval is not None and result.last_eval["num_steps"] == 1
    assert main(["eval", str(tmp_path / "run"), "--samples", "3", "--limit", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "ar" and report["steps"] == 1 and report["temperature"] == 1.0
    assert len(report["curve_steps"]) == 1 and 0 <= report["coverage"] <= 1
    code = main(["solve", "nqueens", "Q" + "." * 24, "--n", "5", "--model", str(tmp_path / "run"), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == (0 if payload["valid"] else 1) and len(payload["answer"]) == 25


def test_graph_colouring_outputs_cover_every_position():
    task = get_task("graph-coloring", n=5)
    torch.manual_seed(0)
    config = ReasonerConfig(vocab_size=task.vocab_size, seq_len=task.seq_len, dim=16, n_heads=2, n_layers=1)
    model = build_reasoner("ar", config).eval()
    x = torch.from_numpy(np.stack([r[0] for r in task.records("test", 0, 2)]).astype(np.int64))
    tokens, _ = model.sample(x, temperature=1.0)
    assert tokens.shape == (1, len(x), task.seq_len)
    assert int(tokens.max()) < task.vocab_size and int(tokens.min()) >= 0
