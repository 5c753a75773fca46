"""The reasoner interface: shapes on every task, one-step gradients, GRAM's KL and stochasticity."""

from __future__ import annotations

import pytest
import torch

from latentloop.errors import UsageError
from latentloop.infer.scaling import draws_samples
from latentloop.models.reasoners import REASONERS, GRAMReasoner, ReasonerConfig, build_reasoner, load_reasoner
from latentloop.models.reasoners.base import ReasoningModule
from latentloop.tasks.base import get_task

TASKS = {
    "nqueens": dict(n=4),
    "graph-coloring": dict(n=5),
    "sudoku": dict(box="2x2"),
}


def tiny(task, **overrides) -> ReasonerConfig:
    base = dict(
        vocab_size=task.vocab_size,
        seq_len=task.seq_len,
        dim=16,
        n_heads=2,
        n_layers=1,
        hidden=32,
        cycles=2,
        inner=2,
    )
    base.update(overrides)
    return ReasonerConfig(**base)


def batch_for(task, size=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(1, task.vocab_size, (size, task.seq_len), generator=generator)
    y = torch.randint(1, task.vocab_size, (size, task.seq_len), generator=generator)
    return {"inputs": x}, y


@pytest.mark.parametrize("task_name", sorted(TASKS))
@pytest.mark.parametrize("arch", sorted(REASONERS))
def test_step_shapes_on_every_task(arch, task_name):
    task = get_task(task_name, **TASKS[task_name])
    torch.manual_seed(0)
    model = build_reasoner(arch, tiny(task))
    batch, y = batch_for(task)
    carry = model.initial_carry(batch)
    for target in (y, None):
        carry, out = model(carry, batch, target=target)
        assert out.logits.shape == (3, task.seq_len, task.vocab_size)
        assert out.halt_logit.shape == out.value.shape == out.kl.shape == (3,)
        assert ((out.value > 0) & (out.value < 1)).all()
        assert all(not v.requires_grad for v in carry.values()), "the carry must leave a step detached"
    if arch != "gram":
        assert (out.kl == 0).all()


def test_trm_mlp_over_sequence_variant():
    task = get_task("sudoku", box="2x2")
    model = build_reasoner("trm", tiny(task, mixer="mlp"))
    batch, y = batch_for(task)
    _, out = model(model.initial_carry(batch), batch, target=y)
    assert out.logits.shape == (3, 16, task.vocab_size)
    assert any("mix" in name for name, _ in model.named_parameters())


# Gradients reach only the last transition of a step ----------------------------------------------------------
GRAD_CALLS = {"direct": 1, "looped": 1, "hrm": 2, "trm": 3, "gram": 3}  # module calls of the last transition


@pytest.mark.parametrize("arch", sorted(GRAD_CALLS))  # the recursive models (ar and mdlm make one pass)
def test_gradient_only_through_the_last_transition(arch):
    task = get_task("nqueens", n=4)
    torch.manual_seed(0)
    model = build_reasoner(arch, tiny(task, cycles=3, inner=2))
    batch, y = batch_for(task)
    calls = {"grad": 0, "no_grad": 0}

    def count(module, args, output):
        calls["grad" if output.requires_grad else "no_grad"] += 1

    for module in model.modules():
        if isinstance(module, ReasoningModule):
            module.register_forward_hook(count)
    carry = {k: v.clone().requires_grad_(True) for k, v in model.initial_carry(batch).items()}
    _, out = model(carry, batch, target=y)
    (out.logits.square().mean() + out.kl.mean()).backward()
    assert calls["grad"] == GRAD_CALLS[arch]
    expected_total = {"direct": 1, "looped": 3, "hrm": 3 * 2 + 3, "trm": 3 * 3, "gram": 3 * 3}[arch]
    assert calls["grad"] + calls["no_grad"] == expected_total
    for name, state in carry.items():
        # Had any gradient flowed through the earlier transitions, the incoming carry would have one.
        assert state.grad is None or not state.grad.any(), name
    assert any(p.grad is not None and p.grad.any() for p in model.parameters())


# GRAM --------------------------------------------------------------------------------------------------------
def _gram(task) -> GRAMReasoner:
    torch.manual_seed(0)
    model = build_reasoner("gram", tiny(task))
    for head in (model.prior, model.posterior):  # away from the zero init, so the heads depend on u
        torch.nn.init.normal_(head.proj.weight, std=0.1)
    return model


def test_gram_kl_zero_when_posterior_equals_prior_and_positive_otherwise():
    task = get_task("nqueens", n=4)
    model = _gram(task)
    batch, y = batch_for(task)
    _, out = model(model.initial_carry(batch), batch, target=y)
    assert (out.kl > 1e-3).all()
    with torch.no_grad():
        model.posterior.load_state_dict(model.prior.state_dict())
        model.target_embed.weight.zero_()
    _, out = model(model.initial_carry(batch), batch, target=y)
    assert torch.allclose(out.kl, torch.zeros(3), atol=1e-5)


def test_gram_samples_differ_and_deterministic_models_do_not():
    task = get_task("nqueens", n=4)
    batch, _ = batch_for(task, size=1)
    for arch in sorted(REASONERS):
        torch.manual_seed(0)
        model = _gram(task) if arch == "gram" else build_reasoner(arch, tiny(task))
        model.eval()
        with torch.no_grad():
            carry = model.initial_carry(batch)
            first = model(carry, batch)[1].logits
            second = model(carry, batch)[1].logits
        assert torch.equal(first, second) != (arch == "gram"), arch


def test_gram_temperature_scales_the_prior_noise_and_zero_follows_its_mean():
    task = get_task("nqueens", n=4)
    model = _gram(task).eval()
    batch, y = batch_for(task, size=2)
    carry = model.initial_carry(batch)

    def step(temperature: float, seed: int = 0, target=None) -> torch.Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            return model(carry, batch, target=target, temperature=temperature)[0]["h"]

    assert torch.equal(step(0.0, seed=1), step(0.0, seed=2)), "temperature 0 draws no noise"
    # The same draw of noise at half the temperature lands half as far from the deterministic part (one
    # transition per step here, so the noise enters once).
    model.config.cycles = 1
    mean, half, full = step(0.0), step(0.5), step(1.0)
    assert not torch.equal(mean, full)
    assert torch.allclose(half - mean, (full - mean) / 2, atol=1e-5)
    # Training samples the posterior, which the temperature does not touch.
    assert torch.equal(step(0.3, target=y), step(1.0, target=y))
    with pytest.raises(UsageError, match="temperature"):
        step(-1.0)


def test_save_and_load_roundtrip(tmp_path):
    task = get_task("nqueens", n=4)
    model = _gram(task)
    model.save_pretrained(tmp_path)
    loaded = load_reasoner(tmp_path)
    assert isinstance(loaded, GRAMReasoner)
    assert torch.equal(loaded.h_init, model.h_init), "the fixed initial state is part of the checkpoint"
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("arch", ["direct", "looped", "hrm", "trm", "gram"])
def test_puzzle_embeddings_prepend_positions_and_name_the_puzzle(arch):
    task = get_task("nqueens", n=4)
    model = build_reasoner(arch, tiny(task, puzzles=5, puzzle_tokens=3)).eval()
    with torch.no_grad():
        model.puzzle_embed.weight.normal_()
    batch, _ = batch_for(task, size=2)
    batch = {"inputs": batch["inputs"][:1].repeat(2, 1), "puzzle_ids": torch.tensor([1, 4])}
    torch.manual_seed(0)
    carry, out = model(model.initial_carry(batch), batch)
    assert out.logits.shape == (2, task.seq_len, task.vocab_size)  # the prefix is not decoded
    assert all(v.shape[1] == 3 + task.seq_len for v in carry.values())
    # One input under two puzzle ids: the ids alone make the answers differ.
    assert not torch.allclose(out.logits[0], out.logits[1])
    with pytest.raises(UsageError, match="puzzle id"):
        model(model.initial_carry({"inputs": batch["inputs"]}), {"inputs": batch["inputs"]})


def test_a_puzzle_embedding_starts_at_zero_and_is_saved(tmp_path):
    task = get_task("nqueens", n=4)
    model = build_reasoner("trm", tiny(task, puzzles=3))
    assert torch.count_nonzero(model.puzzle_embed.weight) == 0
    with torch.no_grad():
        model.puzzle_embed.weight.normal_()
    model.save_pretrained(tmp_path)
    loaded = load_reasoner(tmp_path)
    assert loaded.config.puzzles == 3 and torch.equal(loaded.puzzle_embed.weight, model.puzzle_embed.weight)


@pytest.mark.parametrize("arch", ["looped", "hrm", "trm", "gram"])
def test_a_learned_position_embedding_is_what_tells_positions_apart_without_rope(arch, tmp_path):
    task = get_task("nqueens", n=4)
    model = build_reasoner(arch, tiny(task, pos_encoding="learned")).eval()
    inputs = torch.full((1, task.seq_len), 1)  # every cell alike: only a position code separates them
    batch = {"inputs": inputs}
    _, rope = model.embed_input(inputs)
    assert rope is None

    def logits(net) -> torch.Tensor:
        torch.manual_seed(0)
        with torch.no_grad():
            # GRAM at temperature 0 follows the prior's mean: its noise would tell positions apart too
            options = {"temperature": 0.0} if arch == "gram" else {}
            return net(net.initial_carry(batch), batch, **options)[1].logits[0]

    out = logits(model)
    assert not torch.allclose(out[0], out[1], atol=1e-4)
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(logits(load_reasoner(tmp_path).eval()), out)
    with torch.no_grad():
        model.pos_embed.weight.zero_()
    flat = logits(model)
    torch.testing.assert_close(flat[0], flat[1])
    both = build_reasoner(arch, tiny(task, pos_encoding="rope+learned"))
    assert both.embed_input(inputs)[1] is not None and both.pos_embed is not None


def test_an_unknown_position_encoding_is_refused_and_ar_keeps_rope():
    task = get_task("nqueens", n=4)
    with pytest.raises(UsageError, match="pos_encoding"):
        tiny(task, pos_encoding="absolute")
    with pytest.raises(UsageError, match="pos_encoding"):
        build_reasoner("ar", tiny(task, pos_encoding="learned"))


def test_capabilities_are_declared_on_every_reasoner():
    shipped = {arch: cls for arch, cls in REASONERS.items() if cls.__module__.startswith("latentloop.")}
    declared = {arch: (cls.stochastic, cls.generative) for arch, cls in shipped.items()}
    assert declared == {
        "direct": (False, False),
        "looped": (False, False),
        "hrm": (False, False),
        "trm": (False, False),
        "gram": (True, False),
        "ar": (False, True),
        "mdlm": (False, True),
    }
    # A generative model brings its own sampler; the others decode one supervision step at a time.
    assert all(callable(getattr(cls, "sample", None)) == cls.generative for cls in shipped.values())
    task = get_task("nqueens", n=4)
    drawn = {arch: draws_samples(build_reasoner(arch, tiny(task))) for arch in shipped}
    assert drawn == {arch: stochastic or generative for arch, (stochastic, generative) in declared.items()}
