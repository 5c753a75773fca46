"""GRAM's KL: the Gaussian KL against torch.distributions, and KL balancing's split of the gradient between
the prior (weight ``kl_balance``) and the posterior (weight ``1 - kl_balance``)."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.models.reasoners.gram import balanced_kl, gaussian_kl


def random_gaussians(seed: int, shape=(3, 5, 4)) -> tuple[torch.Tensor, ...]:
    """``(μ_q, σ_q, μ_p, σ_p)`` with means around 0 and log-variances in [-4, 4]."""
    g = torch.Generator().manual_seed(seed)
    mu_q, mu_p = 2 * torch.randn(shape, generator=g), 2 * torch.randn(shape, generator=g)
    log_var_q, log_var_p = (8 * torch.rand(shape, generator=g) - 4 for _ in range(2))
    return mu_q, (0.5 * log_var_q).exp(), mu_p, (0.5 * log_var_p).exp()


def reference_kl(mu_q, std_q, mu_p, std_p) -> torch.Tensor:
    return kl_divergence(Normal(mu_q, std_q), Normal(mu_p, std_p))


@pytest.mark.parametrize("seed", range(4))
def test_gaussian_kl_is_the_kl_of_torch_distributions(seed) -> None:
    gaussians = [t.double() for t in random_gaussians(seed)]
    torch.testing.assert_close(gaussian_kl(*gaussians), reference_kl(*gaussians), rtol=1e-10, atol=1e-12)
    mu_q, std_q, _, _ = gaussians
    assert torch.equal(gaussian_kl(mu_q, std_q, mu_q, std_q), torch.zeros_like(mu_q))


def test_balanced_kl_sums_the_whole_latent_whatever_the_balance() -> None:
    gaussians = [t.double() for t in random_gaussians(7)]
    per_sample = reference_kl(*gaussians).flatten(1).sum(-1)
    for alpha in (0.0, 0.3, 1.0):
        torch.testing.assert_close(balanced_kl(*gaussians, alpha), per_sample, rtol=1e-10, atol=1e-12)


def kl_gradients(alpha: float | None, seed: int = 11) -> dict[str, torch.Tensor]:
    """Gradients of the summed KL with respect to μ_q, σ_q, μ_p, σ_p: balanced with ``alpha``, or the plain KL
    of torch.distributions (``alpha=None``)."""
    leaves = [t.double().requires_grad_() for t in random_gaussians(seed)]
    kl = reference_kl(*leaves).sum() if alpha is None else balanced_kl(*leaves, alpha).sum()
    kl.backward()
    return dict(zip(("mu_q", "std_q", "mu_p", "std_p"), (t.grad for t in leaves), strict=True))


def test_kl_balance_splits_the_gradient_between_prior_and_posterior() -> None:
    plain = kl_gradients(None)
    prior_only, posterior_only, mixed = kl_gradients(1.0), kl_gradients(0.0), kl_gradients(0.3)
    for name in ("mu_q", "std_q"):  # the posterior's parameters
        assert torch.equal(prior_only[name], torch.zeros_like(plain[name]))
        torch.testing.assert_close(posterior_only[name], plain[name])
        torch.testing.assert_close(mixed[name], 0.7 * plain[name])
    for name in ("mu_p", "std_p"):  # the prior's
        assert torch.equal(posterior_only[name], torch.zeros_like(plain[name]))
        torch.testing.assert_close(prior_only[name], plain[name])
        torch.testing.assert_close(mixed[name], 0.3 * plain[name])
    assert all(plain[name].abs().min() > 0 for name in plain)


def gram_head_gradients(kl_balance: float) -> dict[str, torch.Tensor]:
    """Gradients of the noise heads' weights from one supervision step's KL of a tiny GRAM model whose
    prior and posterior disagree (random head weights, seeded alike for every ``kl_balance``)."""
    torch.manual_seed(0)
    config = ReasonerConfig(
        vocab_size=4,
        seq_len=6,
        dim=8,
        n_heads=2,
        n_layers=1,
        hidden=16,
        cycles=2,
        inner=1,
        kl_balance=kl_balance,
    )
    model = build_reasoner("gram", config)
    with torch.no_grad():
        for head in (model.prior, model.posterior):
            head.proj.weight.normal_(std=0.3)
    inputs = torch.randint(0, 4, (3, 6), generator=torch.Generator().manual_seed(1))
    batch = {"inputs": inputs}
    torch.manual_seed(2)  # the same posterior noise in every call
    _, out = model(model.initial_carry(batch), batch, target=inputs.flip(0))
    out.kl.sum().backward()
    weights = {"prior": model.prior.proj.weight, "posterior": model.posterior.proj.weight}
    return {name: torch.zeros_like(w) if w.grad is None else w.grad.clone() for name, w in weights.items()}


def test_the_model_balances_its_kl_by_its_config() -> None:
    prior_only, posterior_only, mixed = (gram_head_gradients(b) for b in (1.0, 0.0, 0.25))
    assert prior_only["prior"].abs().sum() > 0 and torch.equal(
        prior_only["posterior"], torch.zeros_like(prior_only["posterior"])
    )
    assert posterior_only["posterior"].abs().sum() > 0 and torch.equal(
        posterior_only["prior"], torch.zeros_like(posterior_only["prior"])
    )
    torch.testing.assert_close(mixed["prior"], 0.25 * prior_only["prior"])
    torch.testing.assert_close(mixed["posterior"], 0.75 * posterior_only["posterior"])


@pytest.mark.parametrize(("scale", "factor"), [("input", 4.0), ("unscaled", 1.0)])
def test_the_posterior_reads_the_target_at_the_inputs_scale(scale, factor) -> None:
    """``u + √dim · E[y]`` reaches the posterior head under ``target_scale="input"`` (dim 16: 4 times the
    embedding), ``u + E[y]`` under ``"unscaled"``."""
    config = ReasonerConfig(vocab_size=5, seq_len=6, dim=16, n_heads=2, hidden=32, n_sup=1, cycles=1, inner=1)
    config.target_scale = scale
    torch.manual_seed(0)
    model = build_reasoner("gram", config)
    seen: list[torch.Tensor] = []
    model.posterior.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    captured: list[torch.Tensor] = []
    model.f_H.register_forward_hook(lambda _m, _a, out: captured.append(out.detach()))
    batch = {"inputs": torch.randint(1, 5, (2, 6))}
    target = torch.randint(1, 5, (2, 6))
    model(model.initial_carry(batch), batch, target=target)
    e_y = model.target_embed(target)
    torch.testing.assert_close(seen[0] - captured[0], factor * e_y)
