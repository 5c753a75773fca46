"""GRAM trained where inference runs it: the prior's trajectory carried (``model.carry``), the heads on the
prior's detached state judged by the verifier (``model.heads``), the cross-entropy of the prior's decode
(``model.prior_ce``), the KL averaged over positions (``model.kl_reduce``) and Table 4's bounded noise heads
(``model.noise_head``)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from latentloop.errors import UsageError
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.models.reasoners.base import ReasonerOutput
from latentloop.models.reasoners.gram import FIXED_STD, NoiseHead, balanced_kl
from latentloop.train.deep_supervision import supervision_loss
from latentloop.train.loop import train
from latentloop.train.run_config import ReasonerTrainConfig, build_reasoner_config
from tests.tiny import TINY_REASONER


def gram(**options) -> torch.nn.Module:
    config = ReasonerConfig(vocab_size=5, seq_len=6, dim=16, n_heads=2, hidden=32, n_sup=2, cycles=1, inner=1)
    for key, value in options.items():
        setattr(config, key, value)
    config.__post_init__()
    torch.manual_seed(0)
    return build_reasoner("gram", config)


def step(model, seed: int = 0):
    batch = {"inputs": torch.randint(1, 5, (3, 6), generator=torch.Generator().manual_seed(1))}
    target = torch.randint(1, 5, (3, 6), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(seed)
    return model(model.initial_carry(batch), batch, target=target)


def test_the_swiglu_noise_head_starts_at_sigma_0_1_and_stays_at_most_1():
    head = NoiseHead(8, "swiglu", hidden=16)
    mu, std = head(torch.randn(2, 3, 8))
    assert torch.equal(mu, torch.zeros_like(mu))
    torch.testing.assert_close(std, torch.full_like(std, FIXED_STD))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(std=30.0)
    _, std = head(torch.randn(64, 5, 8) * 10)
    assert float(std.detach().max()) <= 1.0 and float(std.detach().min()) > 0
    linear = NoiseHead(8, "linear")
    with torch.no_grad():
        linear.proj.bias.fill_(5.0)
    assert float(linear(torch.zeros(1, 1, 8))[1].detach().min()) > 1.0  # the linear head is unbounded above


def test_the_kl_averaged_over_positions_is_the_sum_over_their_count():
    g = torch.Generator().manual_seed(0)
    mu_q, mu_p = torch.randn(2, 7, 4, generator=g), torch.randn(2, 7, 4, generator=g)
    std_q, std_p = torch.rand(2, 7, 4, generator=g) + 0.1, torch.rand(2, 7, 4, generator=g) + 0.1
    summed = balanced_kl(mu_q, std_q, mu_p, std_p, 0.8, "sum")
    torch.testing.assert_close(balanced_kl(mu_q, std_q, mu_p, std_p, 0.8, "mean"), summed / 7)


@pytest.mark.parametrize("carry", ["posterior", "prior"])
def test_the_carry_is_the_sample_its_option_names(carry):
    model = gram(carry=carry)
    new_carry, out = step(model)
    posterior_state = out.state.detach()
    if carry == "posterior":
        assert torch.equal(new_carry["h"], posterior_state)
        assert out.prior_logits is None
    else:  # the prior's draw from the same u: a different state, and its decode is returned
        assert not torch.equal(new_carry["h"], posterior_state)
        torch.testing.assert_close(out.prior_logits, model.logits_of(new_carry["h"]))


def test_the_default_draws_no_second_sample():
    """Without the options the model's noise is what it was: one draw per transition."""
    plain, _ = step(gram())
    _, out = step(gram(prior_ce=0.5))  # the prior's draw comes after the posterior's
    assert torch.equal(out.state.detach(), plain["h"])


def test_prior_heads_read_the_detached_prior_state():
    model = gram(heads="prior")
    new_carry, out = step(model)
    _, out_posterior = step(gram())
    assert torch.equal(new_carry["h"], out_posterior.state.detach())  # the posterior is still carried
    out.halt_logit.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.f_H.parameters())
    assert model.halt_head.parameters().__next__().grad is not None


def test_the_prior_cross_entropy_and_the_verdict_enter_the_loss():
    tc = ReasonerTrainConfig(halt_weight=0.5, value_weight=0.5)
    labels = torch.tensor([[1, 2], [2, 1]])
    logits = torch.tensor([[[0.0, 2.0, 0.0], [0.0, 0.0, 2.0]], [[0.0, 0.0, 2.0], [0.0, 2.0, 0.0]]])
    prior_logits = torch.zeros(2, 2, 3)
    out = ReasonerOutput(
        logits=logits,
        halt_logit=torch.zeros(2),
        value=torch.full((2,), 0.5),
        kl=torch.zeros(2),
        prior_logits=prior_logits,
    )
    base, parts = supervision_loss(out, labels, 0.1, tc)
    with_prior, prior_parts = supervision_loss(out, labels, 0.1, tc, prior_ce=0.5)
    assert prior_parts["prior_ce"] == pytest.approx(math.log(3))
    assert prior_parts["ce"] == parts["ce"]  # the posterior's, reported apart
    torch.testing.assert_close(with_prior, base + 0.5 * math.log(3))
    verdict = torch.tensor([0.0, 1.0])  # both posterior answers are exact; the verifier judged the prior's
    _, judged = supervision_loss(out, labels, 0.1, tc, verdict=verdict)
    assert judged["halt_loss"] == pytest.approx(
        float(F.binary_cross_entropy_with_logits(torch.zeros(2), verdict))
    )
    assert judged["value_loss"] == pytest.approx(0.25)
    assert parts["value_loss"] == pytest.approx(0.25) and judged["prior_valid"] == 0.5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"carry": "both"}, "model.carry must be one of posterior, prior"),
        ({"noise_head": "mlp"}, "model.noise_head must be one of linear, swiglu"),
        ({"kl_reduce": "max"}, "model.kl_reduce must be one of sum, mean"),
        ({"prior_ce": -1.0}, "model.prior_ce must be at least 0"),
        ({"guidance": "prior", "carry": "prior"}, "need GRAM's posterior"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(UsageError, match=message):
        gram(**options)


def test_a_run_with_every_option_trains_and_resumes_exactly(tmp_path):
    options = {
        "carry": "prior",
        "heads": "prior",
        "prior_ce": 0.5,
        "kl_reduce": "mean",
        "noise_head": "swiglu",
    }
    data = {
        **TINY_REASONER,
        "model": {**TINY_REASONER["model"], **options},
        "train": {**TINY_REASONER["train"], "nearest_target": True, "replace_halted": True},
    }
    whole = train(build_reasoner_config(data, arch="gram"), tmp_path / "whole")
    assert all(math.isfinite(x) for x in whole.losses)
    train(build_reasoner_config(data, arch="gram"), tmp_path / "parts", stop_at=2)
    resumed = train(build_reasoner_config(data, arch="gram"), tmp_path / "parts")
    assert resumed.losses == whole.losses[len(whole.losses) - len(resumed.losses) :]
