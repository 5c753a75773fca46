"""The MDLM baseline: the NELBO weights, the reverse process, sampling, checkpoints, training and eval."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from latentloop.cli import main
from latentloop.infer.scaling import solve
from latentloop.models.reasoners import MDLMReasoner, ReasonerConfig, build_reasoner, load_reasoner
from latentloop.models.reasoners import mdlm as mdlm_module
from latentloop.models.reasoners.mdlm import MASK, mdlm_loss, sample_times, unmask
from latentloop.tasks.base import get_task
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_GENERATIVE, tiny_run

TASK = get_task("nqueens", n=4)


def tiny(**overrides) -> MDLMReasoner:
    torch.manual_seed(0)
    config = dict(vocab_size=TASK.vocab_size, seq_len=TASK.seq_len, dim=16, n_heads=2, n_layers=2, hidden=32)
    return build_reasoner("mdlm", ReasonerConfig(n_sup=1, cycles=4, **{**config, **overrides})).eval()


def inputs(size: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        1, TASK.vocab_size, (size, TASK.seq_len), generator=torch.Generator().manual_seed(seed)
    )


# The objective -------------------------------------------------------------------------------------------------
def test_loss_weights_are_one_over_t_on_masked_tokens_by_hand():
    # Uniform logits over V = 4: every token's CE is log 4. Sample 0: t = 0.5, positions 0 and 1 of 4 masked:
    # (1 / 0.5) * (log 4 + log 4) / 4 = log 4. Sample 1: t = 0.25, position 3 masked: 4 * log 4 / 4 = log 4.
    logits = torch.zeros(2, 4, 4)
    labels = torch.tensor([[1, 2, 3, 0], [0, 1, 2, 3]])
    masked = torch.tensor([[True, True, False, False], [False, False, False, True]])
    loss = mdlm_loss(logits, labels, masked, torch.tensor([0.5, 0.25]))
    assert torch.allclose(loss, torch.full((2,), math.log(4)))
    # A confident right prediction costs ~0 however small t is; unmasked positions never count.
    sure = torch.full((1, 4, 4), -30.0).scatter(-1, labels[:1, :, None], 30.0)
    assert float(mdlm_loss(sure, labels[:1], masked[:1], torch.tensor([1e-3]))) < 1e-6
    wrong = torch.zeros(1, 4, 4)
    wrong[0, 2:, :] = 50.0 * torch.nn.functional.one_hot(torch.tensor([0, 1]), 4)  # wrong, but not masked
    assert torch.allclose(
        mdlm_loss(wrong, labels[:1], masked[:1], torch.tensor([0.5])), torch.tensor(math.log(4))
    )


def test_training_times_cover_the_unit_interval_evenly():
    torch.manual_seed(0)
    t = sample_times(8, "cpu")
    assert ((t >= mdlm_module.T_MIN) & (t < 1)).all()
    gaps = torch.sort(t).values.diff()
    assert torch.allclose(gaps, torch.full_like(gaps, (1 - mdlm_module.T_MIN) / 8), atol=1e-6)


def test_forward_masks_a_share_t_of_tokens_and_returns_the_weighted_loss():
    model = tiny(seq_len=TASK.seq_len)
    x, y = inputs(size=64), inputs(size=64, seed=1)
    seen = {}

    def record(z_masked):
        seen["z"] = z_masked
        return original(x, z_masked)

    original = model.denoise
    model.denoise = lambda inputs, z: record(z)  # type: ignore[method-assign]
    torch.manual_seed(3)
    _, out = model({}, {"inputs": x}, target=y)
    masked = seen["z"] == MASK
    assert torch.equal(seen["z"][~masked], y[~masked]), "unmasked positions show the target"
    torch.manual_seed(3)
    t = sample_times(64, "cpu")
    assert torch.allclose(out.loss, mdlm_loss(out.logits, y, masked, t))
    # Masks are drawn with probability t: the mask share follows t across the batch.
    share = masked.float().mean(-1)
    assert torch.corrcoef(torch.stack([share, t]))[0, 1] > 0.9


# The reverse process -------------------------------------------------------------------------------------------
def test_unmasking_never_changes_a_revealed_token():
    torch.manual_seed(0)
    z = torch.randint(0, 3, (64, 16))
    z[torch.rand(64, 16) < 0.5] = MASK
    logits = torch.randn(64, 16, 3) * 5
    revealed = z != MASK
    for t, s in ((1.0, 0.75), (0.5, 0.25), (0.25, 0.0)):
        out = unmask(z, logits, t, s, temperature=1.0)
        assert torch.equal(out[revealed], z[revealed])
    assert (unmask(z, logits, 0.25, 0.0, 1.0) != MASK).all(), "the last step reveals everything"
    share = (unmask(z, logits, 1.0, 0.75, 1.0)[~revealed] != MASK).float().mean()
    assert 0.18 < float(share) < 0.32, "from t = 1 to 0.75 a masked token is revealed with probability 1/4"


def test_the_sampler_keeps_every_revealed_token_through_all_steps(monkeypatch):
    model = tiny()
    states = []

    def recording_unmask(z, logits, t, s, temperature):
        out = unmask(z, logits, t, s, temperature)
        states.append(out.clone())
        return out

    monkeypatch.setattr(mdlm_module, "unmask", recording_unmask)
    tokens, values = model.sample(inputs(size=8), steps=6, temperature=1.0)
    assert tokens.shape == (6, 8, TASK.seq_len) and values.shape == (6, 8)
    assert len(states) == 6 and (states[0] == MASK).any() and (states[-1] != MASK).all()
    for before, after in itertools.pairwise(states):
        kept = before != MASK
        assert torch.equal(after[kept], before[kept])
    for z, prediction in zip(states, tokens, strict=True):  # each step's prediction shows what is revealed
        assert torch.equal(prediction[z != MASK], z[z != MASK])
    assert torch.equal(tokens[-1], states[-1])
    assert ((values > 0) & (values <= 1)).all()


def test_samples_from_one_input_differ():
    model = tiny()
    torch.manual_seed(0)
    tokens, _ = model.sample(inputs(size=1).repeat(8, 1), steps=4)
    assert len({tuple(t.tolist()) for t in tokens[-1]}) > 1


def test_solve_runs_the_unmasking_steps():
    model = tiny()
    x = inputs(size=2)
    default = solve(model, x, samples=3)
    assert default.predictions.shape == (4, 3, 2, TASK.seq_len), "model.cycles = 4 unmasking steps by default"
    result = solve(model, x, steps=2, samples=5, select="value")
    assert result.predictions.shape == (2, 5, 2, TASK.seq_len) and result.values.shape == (2, 5, 2)
    best = result.values[-1].argmax(0)
    assert torch.equal(result.chosen, result.predictions[-1, best, torch.arange(2)])


def test_shapes_and_forward_without_target_is_the_all_masked_prediction():
    model = tiny()
    x = inputs()
    _, out = model({}, {"inputs": x})
    assert out.logits.shape == (3, TASK.seq_len, TASK.vocab_size) and out.loss is None
    assert torch.equal(out.logits, model.denoise(x, torch.full_like(x, MASK)).logits)


def test_save_and_load_give_the_same_logits(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path)
    loaded = load_reasoner(tmp_path).eval()
    assert isinstance(loaded, MDLMReasoner)
    x = inputs()
    z = inputs(seed=2)
    z[:, ::3] = MASK
    assert torch.equal(model.denoise(x, z).logits, loaded.denoise(x, z).logits)


TINY_RUN = tiny_run(TINY_GENERATIVE, model={"cycles": 3})


def test_a_tiny_training_run_resumes_exactly_and_evaluates(tmp_path, capsys):
    config = build_reasoner_config(TINY_RUN, arch="mdlm")
    whole = train(config, tmp_path / "whole")
    assert sum(whole.losses[-5:]) / 5 < sum(whole.losses[:5]) / 5
    first = train(build_reasoner_config(TINY_RUN, arch="mdlm"), tmp_path / "split", stop_at=12)
    second = train(build_reasoner_config(TINY_RUN, arch="mdlm"), tmp_path / "split")
    assert first.losses + second.losses == whole.losses, "masks come from torch's RNG, restored on resume"
    assert whole.last_eval is not None and whole.last_eval["num_steps"] == 3
    argv = ["eval", str(tmp_path / "whole"), "--samples", "3", "--steps", "2", "--limit", "4", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "mdlm" and report["steps"] == 2 and len(report["curve_steps"]) == 2
    assert 0 <= report["accuracy"] <= 1 and 0 <= report["coverage"] <= 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_temperature_zero_draws_the_argmax(temperature):
    model = tiny()
    x = inputs(size=4)
    torch.manual_seed(1)
    tokens, _ = model.sample(x, steps=1, temperature=temperature)
    one_shot = model.denoise(x, torch.full_like(x, MASK)).logits.argmax(-1)
    assert torch.equal(tokens[-1], one_shot) == (temperature == 0.0)
