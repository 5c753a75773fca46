"""Adaptive exit, criterion by criterion: each criterion's check against KL, entropy, latent difference,
cosine and argmax runs computed by hand, on both sides of its threshold; and the core iterations that
generation spends on each token against a plain decoding loop that applies the same rule by hand."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from latentloop.models.generation import EXIT_CRITERIA, ExitCriterion, generate
from latentloop.models.kv_cache import RecurrentKVCache
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

# ----------------------------------------------------------------------------------------------------------
# Hand-computed quantities (float64 numpy, independent of the package)
# ----------------------------------------------------------------------------------------------------------


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - math.log(np.exp(shifted).sum())


def kl_by_hand(current_logits: np.ndarray, previous_logits: np.ndarray) -> float:
    """KL(p_current || p_previous) of two next-token distributions."""
    log_p, log_q = log_softmax(current_logits), log_softmax(previous_logits)
    return float((np.exp(log_p) * (log_p - log_q)).sum())


def entropy_by_hand(logits: np.ndarray) -> float:
    log_p = log_softmax(logits)
    return float(-(np.exp(log_p) * log_p).sum())


def entropy_diff_by_hand(current_logits: np.ndarray, previous_logits: np.ndarray) -> float:
    return abs(entropy_by_hand(current_logits) - entropy_by_hand(previous_logits))


def latent_diff_by_hand(current: np.ndarray, previous: np.ndarray) -> float:
    current, previous = current.astype(np.float64), previous.astype(np.float64)
    return float(np.linalg.norm(current - previous) / np.linalg.norm(current))


def cosine_distance_by_hand(current: np.ndarray, previous: np.ndarray) -> float:
    current, previous = current.astype(np.float64), previous.astype(np.float64)
    return float(1 - current @ previous / (np.linalg.norm(current) * np.linalg.norm(previous)))


# Criteria that compare two successive iterations: name -> (value by hand, whether it reads logits).
PAIRWISE: dict[str, tuple[Callable[[np.ndarray, np.ndarray], float], bool]] = {
    "kl": (kl_by_hand, True),
    "entropy-diff": (entropy_diff_by_hand, True),
    "latent-diff": (latent_diff_by_hand, False),
    "cosine": (cosine_distance_by_hand, False),
}


def test_every_criterion_is_covered_here() -> None:
    # The exit gate reads a model's own gate; tests/models/test_ouro.py covers both of its modes.
    assert set(EXIT_CRITERIA) == {*PAIRWISE, "argmax-stability", "gate", "gate-full"}


# ----------------------------------------------------------------------------------------------------------
# The check on given distributions and latents
# ----------------------------------------------------------------------------------------------------------


def two_iterations(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """States ``[3, 4, 8]`` and logits ``[3, 4, 6]`` of two successive iterations: row 0 barely moves, row 1
    moves a little, row 2 a lot. Earlier positions change at random: only the last one may count."""
    g = torch.Generator().manual_seed(seed)
    state_1, logits_1 = torch.randn(3, 4, 8, generator=g), torch.randn(3, 4, 6, generator=g)
    scale = torch.tensor([0.01, 0.2, 2.0])[:, None]
    state_2, logits_2 = torch.randn(3, 4, 8, generator=g), torch.randn(3, 4, 6, generator=g)
    state_2[:, -1] = state_1[:, -1] + scale * torch.randn(3, 8, generator=g)
    logits_2[:, -1] = logits_1[:, -1] + scale * torch.randn(3, 6, generator=g)
    return state_1, logits_1, state_2, logits_2


def hand_values(name: str, state_1, logits_1, state_2, logits_2) -> list[float]:
    value, reads_logits = PAIRWISE[name]
    before, after = (logits_1, logits_2) if reads_logits else (state_1, state_2)
    return [value(after[row, -1].numpy(), before[row, -1].numpy()) for row in range(3)]


@pytest.mark.parametrize("name", sorted(PAIRWISE))
def test_pairwise_check_compares_the_hand_value_with_the_threshold(name) -> None:
    iterations = two_iterations(seed=1)
    values = hand_values(name, *iterations)
    assert len({round(v, 6) for v in values}) == 3 and min(values) > 0
    state_1, logits_1, state_2, logits_2 = iterations
    # Just below and just above each row's value: that row's verdict flips, the others' stay.
    for threshold in sorted(v * factor for v in values for factor in (0.99, 1.01)):
        criterion = ExitCriterion(name, threshold)
        first = criterion.check(state_1, logits_1)
        assert first.tolist() == [False] * 3  # nothing to compare with yet
        second = criterion.check(state_2, logits_2)
        assert second.tolist() == [v < threshold for v in values], (name, threshold, values)


@pytest.mark.parametrize("name", sorted(PAIRWISE))
def test_pairwise_check_compares_successive_iterations_and_restarts_on_reset(name) -> None:
    state_1, logits_1, state_2, logits_2 = two_iterations(seed=2)
    moved = hand_values(name, state_1, logits_1, state_2, logits_2)
    criterion = ExitCriterion(name, max(moved) * 1.01)  # every row below the threshold
    criterion.check(state_1, logits_1)
    assert criterion.check(state_2, logits_2).all()
    # A third iteration equal to the first: it is compared with the second, the one just before it.
    back = hand_values(name, state_2, logits_2, state_1, logits_1)
    expected = [v < criterion.threshold for v in back]
    assert criterion.check(state_1, logits_1).tolist() == expected
    criterion.reset()
    assert not criterion.check(state_2, logits_2).any()


def test_argmax_stability_counts_unchanged_argmaxes_in_a_row() -> None:
    # Argmax of the last position per iteration; each row's run of unchanged answers differs.
    argmaxes = [[3, 3, 1, 0], [3, 1, 1, 0], [3, 1, 1, 0], [3, 1, 2, 0], [3, 1, 2, 0]]
    state = torch.zeros(4, 2, 5)
    for threshold in (1, 2, 3):
        criterion = ExitCriterion("argmax-stability", threshold)
        run = [0, 0, 0, 0]
        for i, row_argmax in enumerate(argmaxes):
            logits = torch.randn(4, 2, 5, generator=torch.Generator().manual_seed(i))
            logits[:, -1] = -1.0
            logits[torch.arange(4), -1, torch.tensor(row_argmax)] = 1.0
            if i:
                run = [
                    r + 1 if a == b else 0 for r, a, b in zip(run, row_argmax, argmaxes[i - 1], strict=True)
                ]
            expected = [i > 0 and r >= threshold for r in run]
            assert criterion.check(state, logits).tolist() == expected, (threshold, i)


def test_no_exit_criterion() -> None:
    assert ExitCriterion.parse("none") is None and ExitCriterion.parse(None) is None
    assert ExitCriterion.parse("kl:0.25").threshold == 0.25
    assert ExitCriterion.parse("cosine").threshold == EXIT_CRITERIA["cosine"][0]


# ----------------------------------------------------------------------------------------------------------
# Generation: iterations per token against a plain loop with the rule applied by hand
# ----------------------------------------------------------------------------------------------------------

DEPTH, NEW_TOKENS = 10, 9
# Thresholds inside the range the tiny model's successive iterations span, so tokens exit at different depths.
THRESHOLDS = {"kl": 1e-3, "entropy-diff": 3e-3, "latent-diff": 0.1, "cosine": 5e-3, "argmax-stability": 3}


@pytest.fixture(scope="module")
def model() -> RecurrentDepthLM:
    torch.manual_seed(0)
    config = RecurrentDepthConfig(
        n_embd=64, n_heads=4, intermediate_size=128, vocab_size=96, block_size=64, mean_recurrence=4
    )
    return RecurrentDepthLM(config).eval()


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(1, 96, (1, 9), generator=torch.Generator().manual_seed(3))


def converged_by_hand(name: str, threshold: float, history: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether the iterations so far (last-position state and logits of each) meet criterion ``name``."""
    if len(history) < 2:
        return False
    if name == "argmax-stability":
        answers = [int(np.argmax(logits)) for _, logits in history]
        unchanged = 0
        for before, after in itertools.pairwise(answers):
            unchanged = unchanged + 1 if after == before else 0
        return unchanged >= threshold
    value, reads_logits = PAIRWISE[name]
    (state_0, logits_0), (state_1, logits_1) = history[-2:]
    measured = value(logits_1, logits_0) if reads_logits else value(state_1, state_0)
    # Far from the threshold: float32 and float64 arithmetic then take the same decision.
    assert abs(measured - threshold) > 1e-3 * threshold, (name, measured)
    return measured < threshold


@torch.inference_mode()
def decode_by_hand(model, prompt, name: str | None, threshold: float) -> tuple[list[int], list[int]]:
    """Greedy decoding one token at a time: ``(new tokens, core iterations per token)``. Each token runs
    the core iteration by iteration and stops once the rule holds; the cache slots of iterations it skipped
    take those of its deepest one."""
    config = model.config
    cache = RecurrentKVCache(1, config.n_heads, config.head_dim, config.block_size)
    logits = model(prompt, num_steps=DEPTH, init_scale=0.0, cache=cache).logits[:, -1]
    tokens, iterations = [], []
    used = DEPTH  # the first new token comes from the full-depth prompt pass
    for _ in range(NEW_TOKENS):
        token = logits.argmax(-1)
        tokens.append(int(token))
        iterations.append(used)
        if len(tokens) == NEW_TOKENS:
            break
        ctx = model.context(1, cache=cache)
        embeds = model.embed(token[:, None], ctx)
        state = model.initialize_state(embeds, 0.0)
        cache.ensure_slots(config.n_layers_in_recurrent_block, DEPTH)
        history: list[tuple[np.ndarray, np.ndarray]] = []
        used = DEPTH
        for i in range(DEPTH):
            state = model.core_step(state, embeds, ctx, i)
            if i == DEPTH - 1 or name is None:
                continue
            step_logits = model.predict(state, ctx)[0, -1]
            history.append((state[0, -1].float().numpy(), step_logits.float().numpy()))
            if converged_by_hand(name, threshold, history):
                used = i + 1
                cache.fill_skipped(torch.tensor([True]), cache.length, used)
                break
        logits = model.predict(state, ctx)[:, -1]
        cache.advance(1)
    return tokens, iterations


@pytest.mark.parametrize("name", sorted(THRESHOLDS))
def test_iterations_per_token_match_the_rule_applied_by_hand(model, prompt, name) -> None:
    threshold = THRESHOLDS[name]
    tokens, iterations = decode_by_hand(model, prompt, name, threshold)
    assert min(iterations[1:]) < DEPTH, "the criterion never fired: the threshold tests nothing"
    assert len(set(iterations[1:])) > 1, "every token exited at the same depth"
    out = generate(
        model, prompt, max_new_tokens=NEW_TOKENS, num_steps=DEPTH, init_scale=0.0, exit=f"{name}:{threshold}"
    )
    assert out.steps[0].tolist() == iterations
    assert out.sequences[0, prompt.shape[1] :].tolist() == tokens


def test_without_a_criterion_every_token_runs_the_full_depth(model, prompt) -> None:
    tokens, iterations = decode_by_hand(model, prompt, None, 0.0)
    assert iterations == [DEPTH] * NEW_TOKENS
    for spec in ("none", None):
        out = generate(model, prompt, max_new_tokens=NEW_TOKENS, num_steps=DEPTH, init_scale=0.0, exit=spec)
        assert out.steps[0].tolist() == iterations and out.mean_steps == DEPTH
        assert out.sequences[0, prompt.shape[1] :].tolist() == tokens


def test_both_looped_lm_families_implement_the_looped_lm_protocol():
    from latentloop.models.looped import LoopedLM
    from latentloop.models.ouro import OuroConfig, OuroLM
    from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

    huginn = RecurrentDepthLM(RecurrentDepthConfig(n_embd=32, n_heads=2, intermediate_size=64, vocab_size=64))
    ouro = OuroLM(OuroConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, vocab_size=64))
    assert isinstance(huginn, LoopedLM) and isinstance(ouro, LoopedLM)
    assert not isinstance(torch.nn.Linear(2, 2), LoopedLM)
