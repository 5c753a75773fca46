"""The screened argmax (latentloop.nn.screened): its bound holds where each of its terms is needed, it returns the
fp32 argmax where the fp16 product alone would pick another token, and ``generate(screen_head=True)`` gives the
tokens of plain greedy decoding on both looped-LM families; what it cannot screen is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.models.generation import generate
from latentloop.nn import screened
from latentloop.nn.screened import ScreenedArgmax, can_screen, screened_argmax
from tests.models.test_ouro import tiny

WIDTH = 64
ULP_AT_ONE = 2.0**-10  # fp16's spacing in [1, 2)


def signs(seed: int, balanced: bool = True) -> torch.Tensor:
    """±1 per coordinate; balanced: as many of each."""
    order = torch.randperm(WIDTH, generator=torch.Generator().manual_seed(seed))
    out = torch.ones(WIDTH)
    out[order[: WIDTH // 2]] = -1
    return out if balanced else out.abs()


def off_grid(sign: torch.Tensor, rounding: torch.Tensor) -> torch.Tensor:
    """±1 moved by 0.45 of fp16's spacing in the direction ``rounding``: fp16 rounds it back to ±1."""
    return sign * (1 + 0.45 * ULP_AT_ONE * rounding)


def worst_case_error(screen: ScreenedArgmax, x: torch.Tensor) -> float:
    """How much of its bound the fp16 product's distance from the exact product uses (above 1: broken)."""
    approx, radius = screen.bounds(x[None])
    exact = (x.double() @ screen.weight.double().T).float()
    return float(((approx - exact).abs() / radius).max())


def test_the_bound_covers_the_weights_rounding_where_it_adds_up():
    # w rounds to ±1 with every rounding error along x, and x (fp16-exact) makes the product itself cancel:
    # the error is 64 roundings in a row, and only the |w - w'| |x| term of the bound covers it.
    sign, rounding = signs(0), signs(1)
    weight = off_grid(sign, rounding)[None]
    x = sign * rounding
    screen = ScreenedArgmax(weight)
    assert (
        abs(float(F.linear(x.half(), screen.half))) < 1.0
    )  # the product cancels: no large result to lean on
    assert worst_case_error(screen, x) <= 1.0
    screen.rounding.zero_()  # without the term
    assert worst_case_error(screen, x) > 1.0


def test_the_bound_covers_the_inputs_rounding_where_it_adds_up():
    sign, rounding = signs(2), signs(3)
    weight = sign[None]  # fp16-exact
    x = off_grid(sign * rounding, rounding)  # rounds to ±1 with every rounding error along w; w·x' cancels
    screen = ScreenedArgmax(weight)
    assert worst_case_error(screen, x) <= 1.0
    screen.norm.zero_()  # drops |w'| |x - x'| (and the sums' share, which alone cannot cover it)
    assert worst_case_error(screen, x) > 1.0


@pytest.mark.parametrize("winner", [0, 1])
def test_the_fp32_argmax_where_fp16_cannot_tell_the_two_best_apart(winner):
    torch.manual_seed(0)
    weight = torch.randn(300, WIDTH) * 0.1
    x = torch.randn(WIDTH)
    best = (x / x.norm() * 0.5).half().float()  # fp16-exact, far above every random row
    weight[:2] = best
    weight[winner] += best * 2.0**-13  # under half of fp16's spacing: its fp16 copy is the same
    screen = ScreenedArgmax(weight)
    assert torch.equal(screen.half[0], screen.half[1])
    assert int(F.linear(x.half(), screen.half).float().argmax()) == 0  # fp16 alone would say 0 either way
    logits = screen.logits(x)
    assert int(logits.argmax()) == int(F.linear(x, weight).argmax()) == winner
    kept = torch.isfinite(logits)
    assert kept[:2].all() and int(kept.sum()) == 2  # both kept and computed in fp32, nothing else
    torch.testing.assert_close(logits[:2], F.linear(x, weight[:2]), rtol=1e-6, atol=1e-6)


def test_rows_of_any_shape_and_rows_beyond_fp16_take_the_exact_argmax():
    torch.manual_seed(1)
    weight = torch.randn(500, WIDTH)
    weight[7] = 200.0
    screen = ScreenedArgmax(weight)
    x = torch.randn(2, 3, WIDTH)
    x[1, 2] *= 1e5  # overflows fp16: that row takes the full fp32 product
    x[0, 1] = 50.0  # fp16-exact, but its product with row 7 (640,000) overflows fp16
    logits = screen.logits(x)
    assert logits.shape == (2, 3, 500)
    assert torch.equal(logits.argmax(-1), F.linear(x, weight).argmax(-1))
    for row in ((1, 2), (0, 1)):
        torch.testing.assert_close(logits[row], F.linear(x[row], weight), rtol=1e-4, atol=1e-3)
    assert int(torch.isfinite(logits[0, 0]).sum()) < 10  # the others are screened


def test_random_products_agree_with_the_fp32_argmax_from_few_candidates():
    torch.manual_seed(2)
    weight = torch.randn(4096, 256) * 0.05
    screen = ScreenedArgmax(weight)
    x = torch.randn(64, 256) * 3
    logits = screen.logits(x)
    assert torch.equal(logits.argmax(-1), F.linear(x, weight).argmax(-1))
    assert float(torch.isfinite(logits).sum(-1).float().mean()) < 4  # the screen leaves a handful


def test_the_screen_is_kept_while_the_weight_is_unchanged():
    weight = torch.randn(100, WIDTH)
    first = screened_argmax(weight)
    assert screened_argmax(weight) is first
    weight.mul_(2)
    again = screened_argmax(weight)
    assert again is not first and torch.equal(again.half, weight.half())


@pytest.mark.parametrize(
    "weight, words",
    [
        (torch.randn(10, 8, dtype=torch.bfloat16), "fp32"),
        (torch.full((10, 8), 1e6), "fp16's range"),
        (torch.randn(10), "matrix"),
    ],
)
def test_what_cannot_be_screened_is_refused(weight, words):
    assert words in can_screen(weight)
    with pytest.raises(UsageError, match=words):
        screened_argmax(weight)


def test_a_kernel_that_sums_in_fp16_is_refused(monkeypatch):
    def summing_in_fp16(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(rows.shape[0], weight.shape[0], dtype=torch.half)
        for j in range(weight.shape[1]):
            out = out + (rows[:, j, None].float() * weight[None, :, j].float()).half()
        return out

    assert can_screen(torch.randn(10, 512)) is None
    monkeypatch.setattr(screened.F, "linear", summing_in_fp16)
    assert "strays" in can_screen(torch.randn(10, 512))


@pytest.fixture
def always_screen(monkeypatch):
    """Screening taken as faster at every batch size (on a tiny model it is not)."""
    monkeypatch.setattr(ScreenedArgmax, "pays_off", lambda self, rows, head=None: True)


def test_screened_decoding_gives_the_plain_tokens_on_both_families(tiny_lm, always_screen):
    ouro = tiny(vocab=512)
    ids = torch.randint(1, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    cases = [(tiny_lm, {}), (tiny_lm, {"exit": "kl:5e-4"}), (tiny_lm, {"compile": True})]
    cases += [(tiny_lm, {"num_samples": 2}), (ouro, {}), (ouro, {"exit": "gate-full:0.5"})]
    cases += [(ouro, {"exit": "gate:0.5"}), (ouro, {"compile": True}), (ouro, {"kv_share": 2})]
    for model, settings in cases:
        settings = {"max_new_tokens": 10, "num_steps": 3, **settings}
        torch.manual_seed(0)
        plain = generate(model, ids, attention_mask=mask, **settings)
        torch.manual_seed(0)
        screened_out = generate(model, ids, attention_mask=mask, screen_head=True, **settings)
        assert torch.equal(screened_out.sequences, plain.sequences), settings
        assert torch.equal(screened_out.steps, plain.steps), settings


def test_screened_decoding_chooses_from_the_screen(monkeypatch, always_screen):
    ouro = tiny(vocab=512)
    ids = torch.randint(1, 64, (1, 5))
    calls = []
    original = ScreenedArgmax.logits
    monkeypatch.setattr(ScreenedArgmax, "logits", lambda self, x: calls.append(x.shape) or original(self, x))
    generate(ouro, ids, max_new_tokens=6, num_steps=2, screen_head=True)
    assert calls == [(1, 1, 32)] * 5  # every token after the prefill's first, from the output layer's input


def test_the_screen_is_used_only_at_batch_sizes_where_it_was_timed_faster(monkeypatch):
    timings = iter([1.0, 2.0, 1.0, 0.5])  # full product, then screen: slower at one row, faster at two
    monkeypatch.setattr(screened, "median_seconds", lambda work, *_, **__: (work(), next(timings))[1])
    screen = ScreenedArgmax(torch.randn(300, WIDTH))
    assert not screen.pays_off(1) and screen.pays_off(2)
    assert not screen.pays_off(1) and screen.pays_off(2)  # timed once per row count
    timings = iter([2.0, 1.0])  # another kind of head, slower than the screen at one row: timed apart
    assert screen.pays_off(1, torch.nn.Identity()) and not screen.pays_off(1)
    ouro = tiny(vocab=512)
    ids = torch.randint(1, 64, (1, 5))
    monkeypatch.setattr(
        screened, "median_seconds", lambda work, *_, **__: 1.0
    )  # a tie: the full product stays
    calls = []
    original = ScreenedArgmax.logits
    monkeypatch.setattr(ScreenedArgmax, "logits", lambda self, x: calls.append(x.shape) or original(self, x))
    plain = generate(ouro, ids, max_new_tokens=6, num_steps=2)
    out = generate(ouro, ids, max_new_tokens=6, num_steps=2, screen_head=True)
    assert torch.equal(out.sequences, plain.sequences)
    assert calls == []  # no token came from the screen


def test_timing_the_screen_leaves_the_global_random_state_alone():
    # The decoder draws its random initial states from the global generator after the first token's timing.
    screen = ScreenedArgmax(torch.randn(300, WIDTH))
    torch.manual_seed(0)
    screen.pays_off(3)
    after_timing = torch.rand(4)
    torch.manual_seed(0)
    assert torch.equal(after_timing, torch.rand(4))


@pytest.mark.parametrize(
    "settings",
    [
        {"do_sample": True},
        {"return_logits": True},
        {"speculative": 1},
        {"sampler": "parallel"},
    ],
)
def test_screening_refuses_what_needs_every_logit(settings):
    with pytest.raises(UsageError, match="screen_head"):
        generate(tiny(), torch.randint(1, 64, (1, 4)), screen_head=True, max_new_tokens=2, **settings)


def test_generate_command_screens_and_says_so(tmp_path, capsys):
    folder = tmp_path / "ouro"
    tiny(vocab=300).save_pretrained(folder)
    args = ["generate", str(folder), "ab", "--max-new-tokens", "5", "--num-steps", "2", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--screen-head"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["screen_head"] is True and out["tokens"] == plain["tokens"]
