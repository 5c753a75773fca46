"""GenerationConfig: one clear error per bad field, keywords and a config give the same tokens, and the
registry of exit criteria takes a new criterion with one class."""

from __future__ import annotations

import copy

import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.decoding import (
    ParallelDecoding,
    SequentialDecoding,
    SpeculativeDecoding,
    decoding_strategy,
)
from latentloop.models.exit_criteria import CRITERIA, KLDivergence, LatentChange
from latentloop.models.generation import (
    EXIT_CRITERIA,
    ExitCriterion,
    GenerationConfig,
    generate,
    register_exit_criterion,
)
from latentloop.models.parallel_sampler import ParallelSampler


@pytest.fixture
def prompt() -> torch.Tensor:
    return torch.randint(1, 96, (1, 9), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_new_tokens", -1),
        ("max_new_tokens", 2.5),
        ("num_steps", 0),
        ("init_scale", -0.5),
        ("temperature", -1.0),
        ("top_k", -3),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("stop_tokens", "eos"),
        ("stop_tokens", [1, 2.0]),
        ("pad_token_id", None),
        ("kv_share", 0),
        ("do_sample", "yes"),
        ("speculative", 0),
        ("draft_tokens", 0),
        ("num_samples", True),
        ("num_samples", 0),
        ("weights", "int4"),
    ],
)
def test_each_bad_field_is_named_in_its_error(field, value) -> None:
    with pytest.raises(UsageError, match=field):
        GenerationConfig(**{field: value})


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"exit": "banana"}, "unknown exit criterion"),
        ({"exit": "kl:abc"}, "not a number"),
        ({"exit": "argmax-stability:1.5"}, "whole number"),
        ({"sampler": "beam"}, "unknown sampler"),
        ({"num_samples": 2, "init_scale": 0.0}, "init_scale > 0"),
        ({"num_samples": 2, "speculative": 1}, "num_samples=1"),
        ({"sampler": "parallel", "exit": "kl", "continuous": True}, "combine with exit, continuous"),
        ({"speculative": 2, "exit": "kl"}, "adaptive exit"),
        ({"use_cache": False, "kv_share": 2}, "need the KV cache"),
        ({"speculative": 2, "compile": True}, "compile"),
        ({"weights": "int8", "prepack": True}, "weights does not combine with prepack"),
        ({"weights": "int8", "screen_head": True}, "weights does not combine with prepack or screen_head"),
    ],
)
def test_settings_that_do_not_go_together_are_refused(settings, message) -> None:
    with pytest.raises(UsageError, match=message):
        GenerationConfig(**settings)


def test_a_config_normalises_what_it_is_given() -> None:
    config = GenerationConfig(stop_tokens=[3, 4], exit="none")
    assert config.stop_tokens == (3, 4) and config.exit is None and config.criterion() is None
    assert GenerationConfig(sampler="parallel").parallel == ParallelSampler()
    assert GenerationConfig().parallel is None


def test_the_strategy_follows_the_config() -> None:
    assert type(decoding_strategy(GenerationConfig())) is SequentialDecoding
    assert type(decoding_strategy(GenerationConfig(speculative=2))) is SpeculativeDecoding
    assert type(decoding_strategy(GenerationConfig(sampler="parallel"))) is ParallelDecoding


CALLS = [
    dict(max_new_tokens=8, num_steps=3, init_scale=0.0),
    dict(max_new_tokens=8, num_steps=4, do_sample=True, temperature=0.7, top_k=10, top_p=0.9),
    dict(max_new_tokens=8, num_steps=6, init_scale=0.0, exit="latent-diff:0.1", kv_share=3, continuous=True),
    dict(max_new_tokens=8, num_steps=5, init_scale=0.0, speculative=2, draft_tokens=3),
    dict(max_new_tokens=8, num_steps=4, init_scale=0.0, sampler=ParallelSampler(wavefront=4, inner_steps=2)),
    dict(max_new_tokens=4, num_steps=3, num_samples=3, return_trajectory=True),
]


@pytest.mark.parametrize("settings", CALLS)
def test_keywords_and_a_config_give_the_same_tokens(tiny_lm, prompt, settings) -> None:
    runs = []
    for use_config in (False, True):
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1)
        if use_config:
            out = generate(tiny_lm, prompt, GenerationConfig(**settings), generator=generator)
        else:
            out = generate(tiny_lm, prompt, generator=generator, **settings)
        runs.append(out)
    by_keywords, by_config = runs
    assert torch.equal(by_config.sequences, by_keywords.sequences)
    assert torch.equal(by_config.steps, by_keywords.steps)
    assert all(
        torch.equal(a, b) for a, b in zip(by_keywords.trajectories, by_config.trajectories, strict=True)
    )


def test_keywords_next_to_a_config_may_only_repeat_it(tiny_lm, prompt) -> None:
    config = GenerationConfig(max_new_tokens=3, num_steps=2, init_scale=0.0, stop_tokens=[5])
    same = generate(tiny_lm, prompt, config, num_steps=2, stop_tokens=(5,))
    assert torch.equal(same.sequences, generate(tiny_lm, prompt, config).sequences)
    with pytest.raises(UsageError, match="num_steps, exit"):
        generate(tiny_lm, prompt, config, num_steps=3, exit="kl", max_new_tokens=3)
    with pytest.raises(TypeError, match="beam_width"):
        generate(tiny_lm, prompt, config, beam_width=2)
    with pytest.raises(TypeError, match="GenerationConfig"):
        generate(tiny_lm, prompt, 3)


def test_the_registry_builds_criteria_by_name() -> None:
    assert set(EXIT_CRITERIA) == set(CRITERIA)
    assert type(ExitCriterion("kl")) is KLDivergence and ExitCriterion("kl").threshold == 5e-4
    assert type(ExitCriterion.parse("latent-diff:0.2")) is LatentChange
    assert EXIT_CRITERIA["latent-diff"] == (0.03, False)
    criterion = ExitCriterion("cosine", 0.01)
    twin = copy.deepcopy(GenerationConfig(exit=criterion)).exit
    assert type(twin) is type(criterion) and twin.threshold == 0.01
    for taken in ("kl", "none", "a:b", ""):
        with pytest.raises(ValueError, match="exit criterion name"):
            register_exit_criterion(taken)(KLDivergence)


@pytest.fixture
def after_iterations():
    """A criterion registered for one test: every row stops after ``threshold`` iterations."""

    @register_exit_criterion("after")
    class AfterIterations(ExitCriterion):
        default = 2
        needs_logits = True

        def reset(self) -> None:
            self.seen = 0

        def check(self, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
            assert logits is not None and logits.shape[:2] == state.shape[:2]
            self.seen += 1
            return torch.full((state.shape[0],), self.seen >= self.threshold, device=state.device)

    yield AfterIterations
    del CRITERIA["after"]


def test_a_criterion_registered_elsewhere_runs_end_to_end(tiny_lm, prompt, after_iterations) -> None:
    assert "after" in EXIT_CRITERIA
    batch = prompt.repeat(2, 1)
    for spec, iterations in (("after", 2), ("after:3", 3)):
        out = generate(tiny_lm, batch, max_new_tokens=5, num_steps=6, init_scale=0.0, exit=spec)
        assert out.steps.tolist() == [[6] + [iterations] * 4] * 2  # the first token comes from the prefill
    with pytest.raises(UsageError, match="unknown exit criterion"):
        generate(tiny_lm, prompt, max_new_tokens=2, exit="before")
