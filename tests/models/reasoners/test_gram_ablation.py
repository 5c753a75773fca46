"""GRAM's ablation variants (``model.guidance``): the full model draws training noise from the posterior and
pays a KL; "without stochastic guidance" (prior) has no posterior and trains on the prior's noise; "stochasticity
only" (none) has no noise heads and draws N(0, 0.1²) whatever the state. ``model.guided_transitions`` says
which transitions of a training step draw from the posterior: all of them, or only the last, whose KL is paid;
``model.target_reveal`` shows the posterior each target cell only from its own random supervision step on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from latentloop.errors import UsageError
from latentloop.models.reasoners import ReasonerConfig, build_reasoner
from latentloop.models.reasoners.gram import FIXED_STD, GRAMReasoner


def tiny_gram(guidance: str, seed: int = 0, **options: object) -> GRAMReasoner:
    """A toy GRAM (6 cells, 5 tokens, 2 transitions a step) whose noise heads (where it has them) depend on
    ``u``."""
    torch.manual_seed(seed)
    options = {"guidance": guidance, **options}
    config = ReasonerConfig(
        vocab_size=5, seq_len=6, dim=8, n_heads=2, n_layers=1, hidden=16, cycles=2, inner=1, **options
    )
    model = build_reasoner("gram", config)
    for head in (model.prior, model.posterior):
        if head is not None:  # away from the zero init, so the heads read u
            torch.nn.init.normal_(head.proj.weight, std=0.3)
    return model


def toy_batch(seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"inputs": torch.randint(1, 5, (3, 6), generator=g)}, torch.randint(2, 5, (3, 6), generator=g)


def step(model: GRAMReasoner, batch, target, seed: int, temperature: float = 1.0):
    torch.manual_seed(seed)
    return model(model.initial_carry(batch), batch, target=target, temperature=temperature)


def one_transition(model: GRAMReasoner, inputs: torch.Tensor, seed: int, temperature: float = 1.0):
    """``(u, h)``: the deterministic update and the state after its noise, for one transition from the
    initial carry (the same noise draw for both, from ``seed``)."""
    batch = {"inputs": inputs}
    carry = model.initial_carry(batch)
    e_x, rope = model.embed_input(inputs)
    l = model.f_L(carry["l"], carry["h"] + e_x, rope)  # noqa: E741
    u = model.f_H(carry["h"], l, rope)
    torch.manual_seed(seed)
    h, _, kl, _ = model.transition(carry["h"], carry["l"], e_x, rope, None, temperature)
    return u, h, kl


def parameter_names(model: GRAMReasoner) -> set[str]:
    return {name.split(".")[0] for name, _ in model.named_parameters()}


def test_each_variant_has_exactly_the_noise_parts_it_claims() -> None:
    assert {"prior", "posterior", "target_embed"} <= parameter_names(tiny_gram("posterior"))
    assert "prior" in parameter_names(tiny_gram("prior"))
    assert not {"posterior", "target_embed"} & parameter_names(tiny_gram("prior"))
    assert not {"prior", "posterior", "target_embed"} & parameter_names(tiny_gram("none"))


def test_an_unknown_guidance_is_refused() -> None:
    with pytest.raises(UsageError, match=r"model\.guidance must be one of posterior, prior, none"):
        ReasonerConfig(guidance="learned")


def test_the_full_model_trains_on_the_posterior_and_pays_a_kl() -> None:
    model = tiny_gram("posterior")
    batch, y = toy_batch()
    _, guided = step(model, batch, y, seed=3)
    _, unguided = step(model, batch, None, seed=3)
    assert (guided.kl > 0).all()
    assert not torch.equal(guided.logits, unguided.logits)  # the target moved the noise


def test_without_guidance_training_draws_the_prior_noise_and_the_kl_is_zero() -> None:
    model = tiny_gram("prior")
    batch, y = toy_batch()
    _, trained = step(model, batch, y, seed=3)
    _, inferred = step(model, batch, None, seed=3)
    # The target changes nothing: the same draw from the prior as at inference, and no KL.
    assert torch.equal(trained.logits, inferred.logits)
    assert torch.equal(trained.kl, torch.zeros(3))
    # The prior still learns, through the reparameterised cross-entropy.
    F.cross_entropy(trained.logits.flatten(0, 1), y.flatten()).backward()
    assert model.prior.proj.weight.grad.abs().sum() > 0


def test_without_guidance_the_noise_is_the_priors_reparameterised_draw() -> None:
    model = tiny_gram("prior").eval()
    inputs = toy_batch()[0]["inputs"]
    with torch.no_grad():
        u, h, kl = one_transition(model, inputs, seed=5, temperature=0.5)
        mu, std = model.prior(u)
        torch.manual_seed(5)
        expected = u + (mu + 0.5 * std * torch.randn(u.shape))
    assert torch.equal(h, expected)
    assert torch.equal(kl, torch.zeros(3))


def test_stochasticity_only_draws_fixed_noise_that_ignores_the_input() -> None:
    model = tiny_gram("none").eval()
    first, second = torch.tensor([[1, 2, 3, 4, 1, 2]]), torch.tensor([[4, 4, 3, 1, 2, 2]])
    with torch.no_grad():
        u1, h1, kl = one_transition(model, first, seed=7)
        u2, h2, _ = one_transition(model, second, seed=7)
        torch.manual_seed(7)
        expected_noise = FIXED_STD * torch.randn(u1.shape)
    assert not torch.equal(u1, u2)
    assert torch.equal(h1, u1 + expected_noise)  # exactly N(0, σ₀²): no mean, no σ from the state
    assert torch.equal(h2, u2 + expected_noise)  # the same draw whatever the input
    assert torch.equal(kl, torch.zeros(1))
    # Temperature 0 removes the noise.
    with torch.no_grad():
        u0, h0, _ = one_transition(model, first, seed=7, temperature=0.0)
    assert torch.equal(h0, u0)


def test_stochasticity_only_ignores_the_target_in_training() -> None:
    model = tiny_gram("none")
    batch, y = toy_batch()
    _, trained = step(model, batch, y, seed=3)
    _, inferred = step(model, batch, None, seed=3)
    assert torch.equal(trained.logits, inferred.logits)
    assert torch.equal(trained.kl, torch.zeros(3))


def test_guided_transitions_last_keeps_the_target_out_of_the_unpaid_transitions() -> None:
    batch, y = toy_batch()
    other_y = y % 4 + 1
    model = tiny_gram("posterior", guided_transitions="last")
    carry, out = step(model, batch, y, seed=3)
    other_carry, other_out = step(model, batch, other_y, seed=3)
    unguided_carry, _ = step(model, batch, None, seed=3)
    # l of the last transition reads h after the first: the prior's draw, the same as at inference.
    assert torch.equal(carry["l"], other_carry["l"])
    assert torch.equal(carry["l"], unguided_carry["l"])
    # The last transition, whose KL the loss pays, still draws from the posterior.
    assert not torch.equal(carry["h"], other_carry["h"])
    assert (out.kl > 0).all() and not torch.equal(out.kl, other_out.kl)


def test_guided_transitions_all_lets_the_target_into_every_transition() -> None:
    batch, y = toy_batch()
    model = tiny_gram("posterior")
    carry, _ = step(model, batch, y, seed=3)
    other_carry, _ = step(model, batch, y % 4 + 1, seed=3)
    assert not torch.equal(carry["l"], other_carry["l"])


def test_an_unknown_guided_transitions_is_refused() -> None:
    with pytest.raises(UsageError, match=r"model\.guided_transitions must be one of all, last"):
        ReasonerConfig(guided_transitions="first")


def test_target_reveal_hides_each_cell_from_the_posterior_until_its_step() -> None:
    batch, y = toy_batch()
    model = tiny_gram("posterior", target_reveal=3)
    torch.manual_seed(1)
    carry = model.initial_carry(batch)
    reveal_at = carry["reveal_at"]
    assert reveal_at.shape == (3, 6) and set(reveal_at.unique().tolist()) <= {0, 1, 2}
    hidden = (reveal_at > 0).nonzero()[0].tolist()
    shown = (reveal_at == 0).nonzero()[0].tolist()

    def changed(cell: list[int]) -> torch.Tensor:
        other = y.clone()
        other[cell[0], cell[1]] = other[cell[0], cell[1]] % 4 + 1
        return other

    def first_step(target: torch.Tensor):
        torch.manual_seed(3)
        return model(carry, batch, target=target)

    after, out = first_step(y)
    assert torch.equal(out.logits, first_step(changed(hidden))[1].logits)  # not yet revealed: not read
    assert not torch.equal(out.logits, first_step(changed(shown))[1].logits)
    assert torch.equal(after["reveal_at"], reveal_at) and after["step"].tolist() == [1, 1, 1]
    # From step target_reveal - 1 on, every cell is revealed.
    late = carry | {"step": torch.full((3,), 2)}
    torch.manual_seed(3)
    base = model(late, batch, target=y)[1].logits
    torch.manual_seed(3)
    assert not torch.equal(base, model(late, batch, target=changed(hidden))[1].logits)


def test_without_target_reveal_the_carry_holds_the_state_alone() -> None:
    batch, _ = toy_batch()
    assert set(tiny_gram("posterior").initial_carry(batch)) == {"h", "l"}


def test_prior_share_trains_its_unguided_samples_on_the_prior_and_charges_them_no_kl() -> None:
    batch, y = toy_batch()
    model = tiny_gram("posterior", prior_share=0.5)
    carry = model.initial_carry(batch) | {"unguided": torch.tensor([True, False, True])}

    def trained(target: torch.Tensor | None):
        torch.manual_seed(3)
        return model(carry, batch, target=target)

    after, out = trained(y)
    _, inferred = trained(None)
    _, other_target = trained(y % 4 + 1)
    # The unguided rows draw what inference draws, whatever the target; the guided row reads the target.
    assert torch.equal(out.logits[[0, 2]], inferred.logits[[0, 2]])
    assert torch.equal(out.logits[[0, 2]], other_target.logits[[0, 2]])
    assert not torch.equal(out.logits[1], other_target.logits[1])
    assert out.kl[0] == 0 and out.kl[2] == 0 and out.kl[1] > 0
    assert torch.equal(after["unguided"], carry["unguided"])  # kept for the sample's whole trajectory


def test_prior_share_marks_about_its_share_of_the_samples() -> None:
    inputs = torch.randint(1, 5, (4000, 6), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    unguided = tiny_gram("posterior", prior_share=0.25).initial_carry({"inputs": inputs})["unguided"]
    assert unguided.dtype == torch.bool and abs(unguided.float().mean().item() - 0.25) < 0.03


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"guidance": "posterior", "prior_share": 1.0}, r"model\.prior_share must be in \[0, 1\)"),
        ({"guidance": "posterior", "prior_share": -0.1}, r"model\.prior_share must be in \[0, 1\)"),
        ({"guidance": "prior", "prior_share": 0.5}, r"model\.prior_share needs a posterior"),
    ],
)
def test_a_prior_share_without_meaning_is_refused(options: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ReasonerConfig(**options)
