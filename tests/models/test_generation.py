import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.generation import ExitCriterion, generate, select_token, vote_continuations
from latentloop.models.kv_cache import LayerKey, RecurrentKVCache


@pytest.fixture
def prompt() -> torch.Tensor:
    return torch.randint(1, 96, (1, 9), generator=torch.Generator().manual_seed(3))


def greedy(model, ids, **kwargs):
    return generate(model, ids, max_new_tokens=kwargs.pop("n", 12), init_scale=0.0, **kwargs).sequences


def test_cached_greedy_equals_recomputation_token_for_token(tiny_lm):
    ids = torch.randint(1, 96, (3, 7), generator=torch.Generator().manual_seed(4))
    for depth in (1, 3, 6):
        assert torch.equal(
            greedy(tiny_lm, ids, num_steps=depth), greedy(tiny_lm, ids, num_steps=depth, use_cache=False)
        )


def test_kv_share_with_budget_at_least_depth_equals_no_sharing(tiny_lm, prompt):
    plain = greedy(tiny_lm, prompt, num_steps=5)
    assert torch.equal(greedy(tiny_lm, prompt, num_steps=5, kv_share=5), plain)
    assert torch.equal(greedy(tiny_lm, prompt, num_steps=5, kv_share=8), plain)


def test_kv_share_bounds_cache_memory(tiny_lm, prompt):
    config = tiny_lm.config
    sizes = {}
    for share in (None, 4):
        cache = RecurrentKVCache(1, config.n_heads, config.head_dim, 64, kv_share=share)
        tiny_lm(prompt, num_steps=32, init_scale=0.0, cache=cache)
        sizes[share] = cache.nbytes()
    # (prelude + coda + 2 core layers x 4 slots) / (prelude + coda + 2 core layers x 32 slots)
    assert sizes[4] / sizes[None] == pytest.approx((2 + 2 * 4) / (2 + 2 * 32))


def test_adaptive_exit_with_threshold_zero_equals_fixed_depth(tiny_lm, prompt):
    plain = greedy(tiny_lm, prompt, num_steps=6)
    for spec in ("kl:0", "entropy-diff:0", "latent-diff:0", "cosine:0"):
        out = generate(tiny_lm, prompt, max_new_tokens=12, num_steps=6, init_scale=0.0, exit=spec)
        assert torch.equal(out.sequences, plain), spec
        assert out.mean_steps == 6


def test_adaptive_exit_saves_iterations_and_counts_them(tiny_lm, prompt):
    out = generate(tiny_lm, prompt, max_new_tokens=10, num_steps=16, init_scale=0.0, exit="latent-diff:0.5")
    assert out.steps.shape == (1, 10)
    assert out.steps[0, 0] == 16  # the first new token comes from the full-depth prefill
    assert 1 <= out.mean_steps < 16


def test_exited_tokens_fill_skipped_slots_from_deepest_same_residue():
    cache = RecurrentKVCache(2, 1, 2, 4, kv_share=4)
    for slot in range(4):
        k = torch.full((2, 1, 1, 2), float(slot))
        cache.hook(LayerKey("core", 0, slot), 0)(k, k)
    rows = torch.tensor([True, False])
    cache.fill_skipped(rows, position=0, iterations_done=2)
    keys = {key.slot: t for key, t in cache.keys.items()}
    # row 0 ran iterations 0 and 1: slots 2 and 3 take iteration 1's keys; row 1 keeps its own
    assert [keys[s][0, 0, 0, 0].item() for s in range(4)] == [0, 1, 1, 1]
    assert [keys[s][1, 0, 0, 0].item() for s in range(4)] == [0, 1, 2, 3]


def test_left_padded_batch_generates_what_each_row_generates_alone(tiny_lm):
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(1, 96, (n,), generator=g) for n in (9, 4, 6)]
    width = max(len(r) for r in rows)
    batch = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for i, r in enumerate(rows):
        batch[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    out = generate(
        tiny_lm, batch, attention_mask=mask, max_new_tokens=10, num_steps=4, init_scale=0.0
    ).sequences
    for i, r in enumerate(rows):
        alone = greedy(tiny_lm, r[None], num_steps=4, n=10)
        assert torch.equal(out[i, width:], alone[0, len(r) :]), i


def test_greedy_speculative_decoding_equals_plain_greedy(tiny_lm, prompt):
    plain = greedy(tiny_lm, prompt, num_steps=6, n=15)
    for draft_steps, draft_tokens in ((1, 3), (2, 5), (6, 2)):
        spec = greedy(tiny_lm, prompt, num_steps=6, n=15, speculative=draft_steps, draft_tokens=draft_tokens)
        assert torch.equal(spec, plain), (draft_steps, draft_tokens)


def test_continuous_mode_and_trajectories(tiny_lm, prompt):
    out = generate(
        tiny_lm,
        prompt,
        max_new_tokens=5,
        num_steps=4,
        init_scale=0.0,
        continuous=True,
        return_trajectory=True,
    )
    assert len(out.trajectories) == 4 and out.trajectories[0].shape == (4, 1, 64)
    # warm start changes the computation, so the first decoded token's trajectory starts elsewhere
    cold = generate(tiny_lm, prompt, max_new_tokens=5, num_steps=4, init_scale=0.0, return_trajectory=True)
    assert not torch.allclose(out.trajectories[0][0], cold.trajectories[0][0])


def test_stop_tokens_end_generation(tiny_lm, prompt):
    first = greedy(tiny_lm, prompt, num_steps=3, n=1)[0, -1].item()
    out = generate(tiny_lm, prompt, max_new_tokens=10, num_steps=3, init_scale=0.0, stop_tokens=[first])
    assert out.sequences.shape[1] == prompt.shape[1] + 1


def test_sampling_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert select_token(logits).item() == 3
    g = torch.Generator().manual_seed(0)
    draws = {select_token(logits, do_sample=True, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {2, 3}
    draws = {select_token(logits, do_sample=True, top_p=0.5, generator=g).item() for _ in range(200)}
    assert draws == {3}


def test_bad_generation_arguments_are_usage_errors(tiny_lm, prompt):
    with pytest.raises(UsageError, match="unknown exit criterion"):
        ExitCriterion.parse("banana:1")
    with pytest.raises(UsageError, match="not a number"):
        ExitCriterion.parse("kl:abc")
    with pytest.raises(UsageError, match="empty"):
        generate(tiny_lm, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(UsageError, match="block_size"):
        generate(tiny_lm, prompt, max_new_tokens=1000)


def test_model_generate_method_is_greedy_by_default(tiny_lm, prompt):
    ids = tiny_lm.generate(prompt, max_new_tokens=6, num_steps=3, init_scale=0.0)
    assert torch.equal(ids, greedy(tiny_lm, prompt, num_steps=3, n=6))


def test_vote_returns_the_continuation_all_trajectories_share():
    same = torch.tensor([[[5, 9], [5, 9], [5, 9]]])
    chosen, votes = vote_continuations(same)
    assert chosen.tolist() == [0] and votes.tolist() == [3]


def test_vote_picks_the_majority_and_breaks_ties_towards_the_earliest():
    rows = torch.tensor(
        [
            [[1, 0], [2, 0], [2, 0], [3, 0]],  # 2 wins, first seen at index 1
            [[4, 0], [5, 0], [5, 0], [4, 0]],  # a tie 2 : 2 goes to the earliest (index 0)
            [[7, 0], [8, 0], [9, 0], [6, 0]],  # all different: the first
            [[1, 2], [1, 3], [1, 3], [1, 2]],  # rows differing only in a later token are different answers
        ]
    )
    chosen, votes = vote_continuations(rows)
    assert chosen.tolist() == [1, 0, 0, 0]
    assert votes.tolist() == [2, 2, 1, 2]


def test_width_runs_k_trajectories_and_returns_the_voted_one(tiny_lm):
    ids = torch.randint(1, 96, (2, 6), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    out = generate(tiny_lm, ids, max_new_tokens=3, num_steps=3, init_scale=1.0, num_samples=5)
    assert out.samples.shape == (2, 5, 9) and out.sequences.shape == (2, 9)
    for row in range(2):
        new = out.samples[row, :, 6:]
        counts = [(new == new[j]).all(-1).sum().item() for j in range(5)]
        assert int(out.votes[row]) == max(counts)
        assert (out.samples[row] == out.sequences[row]).all(-1).sum() == max(counts)
        assert torch.equal(out.sequences[row, :6], ids[row])


def test_trajectories_from_random_states_differ_and_from_the_zero_state_do_not(tiny_lm):
    ids = torch.randint(1, 96, (1, 6), generator=torch.Generator().manual_seed(6))
    torch.manual_seed(0)
    out = generate(
        tiny_lm, ids, max_new_tokens=2, num_steps=4, init_scale=1.0, num_samples=4, return_trajectory=True
    )
    states = out.trajectories[0][-1]  # [K, h]: each trajectory's last state for the second new token
    assert all(not torch.allclose(states[0], states[j]) for j in range(1, 4))
    zero = generate(
        tiny_lm, ids.repeat(4, 1), max_new_tokens=2, num_steps=4, init_scale=0.0, return_trajectory=True
    )
    assert all(torch.equal(zero.trajectories[0][-1][0], zero.trajectories[0][-1][j]) for j in range(1, 4))


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"num_samples": 3, "init_scale": 0.0}])
def test_bad_widths_are_refused(tiny_lm, prompt, kwargs):
    with pytest.raises(UsageError, match="num_samples"):
        generate(tiny_lm, prompt, max_new_tokens=2, **{"init_scale": 1.0, **kwargs})


def test_compiled_decoding_computes_what_eager_decoding_does(tiny_lm):
    """Every state of every core iteration, and the tokens, of a left-padded batch with a shared cache and a
    per-row exit: the compiled steps write the same cache positions and mask the same keys."""
    g = torch.Generator().manual_seed(6)
    batch = torch.randint(1, 96, (3, 8), generator=g)
    mask = torch.ones_like(batch)
    mask[1, :3] = mask[2, :5] = 0
    settings = [
        dict(kv_share=3, return_trajectory=True, return_logits=True),
        dict(attention_mask=mask, exit="latent-diff:0.05", continuous=True, return_logits=True),
    ]
    for options in settings:
        runs = [
            generate(
                tiny_lm, batch, max_new_tokens=9, num_steps=5, init_scale=0.0, compile=compiled, **options
            )
            for compiled in (False, True)
        ]
        eager, compiled = runs
        assert torch.equal(compiled.sequences, eager.sequences), options
        assert torch.equal(compiled.steps, eager.steps), options
        for a, b in zip(eager.trajectories, compiled.trajectories, strict=True):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled.logits, eager.logits, atol=1e-5, rtol=1e-5)
    assert len(runs[0].steps.unique()) > 1  # the exit took rows out at different depths


def test_compiled_decoding_refuses_what_it_does_not_run(tiny_lm, prompt):
    for options in (dict(use_cache=False), dict(speculative=2), dict(sampler="parallel")):
        with pytest.raises(UsageError, match="compile"):
            generate(tiny_lm, prompt, max_new_tokens=4, num_steps=4, init_scale=0.0, compile=True, **options)


def test_returned_logits_are_those_of_a_full_forward_pass_over_the_prefix(tiny_lm, prompt):
    out = generate(tiny_lm, prompt, max_new_tokens=6, num_steps=4, init_scale=0.0, return_logits=True)
    start = prompt.shape[1]
    assert out.logits.shape == (1, 6, tiny_lm.config.vocab_size)
    with torch.no_grad():
        full = tiny_lm(out.sequences[:, :-1], num_steps=4, init_scale=0.0).logits[:, start - 1 :]
    torch.testing.assert_close(out.logits, full, atol=1e-5, rtol=1e-5)
    assert torch.equal(out.logits.argmax(-1), out.sequences[:, start:])
