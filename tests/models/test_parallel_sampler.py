import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.generation import generate
from latentloop.models.parallel_sampler import ParallelSampler


@pytest.fixture
def prompt() -> torch.Tensor:
    return torch.randint(1, 96, (1, 7), generator=torch.Generator().manual_seed(11))


@pytest.mark.parametrize("init_scale", [0.0, 1.0])
@pytest.mark.parametrize("depth", [1, 3, 6])
def test_at_its_limit_the_parallel_sampler_is_sequential_decoding(tiny_lm, prompt, depth, init_scale):
    limit = ParallelSampler(wavefront=1, inner_steps=depth, freeze="steps")
    torch.manual_seed(0)
    sequential = generate(
        tiny_lm, prompt, max_new_tokens=12, num_steps=depth, init_scale=init_scale, kv_share=1
    )
    torch.manual_seed(0)
    parallel = generate(
        tiny_lm, prompt, max_new_tokens=12, num_steps=depth, init_scale=init_scale, sampler=limit
    )
    assert torch.equal(parallel.sequences, sequential.sequences)
    assert parallel.steps.tolist() == [[depth] * 12]
    assert parallel.sweeps == 11  # the first token comes from the prompt's pass


def test_a_wide_wave_shares_sweeps_between_tokens(tiny_lm, prompt):
    wide = generate(
        tiny_lm,
        prompt,
        max_new_tokens=16,
        num_steps=8,
        init_scale=0.0,
        sampler=ParallelSampler(wavefront=16, inner_steps=2, freeze="steps"),
    )
    assert wide.sequences.shape == (1, 7 + 16)
    assert torch.equal(wide.sequences[:, :7], prompt)
    # Sequentially 15 tokens after the first need 15 x 8 / 2 = 60 sweeps of 2 iterations; the wave needs fewer.
    assert wide.sweeps < 60
    assert all(s >= 8 for s in wide.steps[0, 1:].tolist())  # with freeze=steps every position gets its depth


def test_latent_diff_freezes_positions_before_their_full_depth(tiny_lm, prompt):
    out = generate(
        tiny_lm,
        prompt,
        max_new_tokens=10,
        num_steps=32,
        init_scale=0.0,
        sampler=ParallelSampler(wavefront=8, inner_steps=4, freeze="latent-diff:0.5"),
    )
    assert out.sequences.shape == (1, 17)
    assert min(out.steps[0, 1:].tolist()) < 32


def test_the_parallel_sampler_stops_at_a_stop_token(tiny_lm, prompt):
    full = generate(tiny_lm, prompt, max_new_tokens=8, num_steps=2, init_scale=0.0, sampler="parallel")
    stop = int(full.sequences[0, 7 + 3])
    cut = generate(
        tiny_lm, prompt, max_new_tokens=8, num_steps=2, init_scale=0.0, sampler="parallel", stop_tokens=[stop]
    )
    first = full.sequences[0, 7:].tolist().index(stop)
    assert cut.sequences[0, 7:].tolist() == full.sequences[0, 7 : 7 + first + 1].tolist()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"wavefront": 0}, "wavefront"),
        ({"inner_steps": 0}, "inner_steps"),
        ({"freeze": "kl"}, "freeze"),
        ({"freeze": "latent-diff:x"}, "not a number"),
        ({"freeze": "latent-diff:-1"}, "positive"),
        ({"state_noise": 2.0}, "state_noise"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(UsageError, match=message):
        ParallelSampler(**settings)


def test_unknown_samplers_and_incompatible_options_are_refused(tiny_lm, prompt):
    with pytest.raises(UsageError, match="unknown sampler"):
        generate(tiny_lm, prompt, max_new_tokens=2, sampler="beam")
    with pytest.raises(UsageError, match="kv_share"):
        generate(tiny_lm, prompt, max_new_tokens=2, sampler="parallel", kv_share=2)
    with pytest.raises(UsageError, match="num_samples=1"):
        generate(tiny_lm, prompt, max_new_tokens=2, sampler="parallel", init_scale=1.0, num_samples=3)
    with pytest.raises(UsageError, match="attention_mask"):
        generate(
            tiny_lm, prompt, max_new_tokens=2, sampler="parallel", attention_mask=torch.ones_like(prompt)
        )
    with pytest.raises(UsageError, match="one prompt"):
        generate(tiny_lm, prompt.repeat(2, 1), max_new_tokens=2, sampler="parallel")
