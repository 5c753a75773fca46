"""The batching engine gives each request the tokens ``generate`` gives it alone, whoever shares its batch."""

from __future__ import annotations

import threading

import pytest
import torch

from latentloop.errors import UsageError
from latentloop.models.generation import GenerationConfig, generate
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.serve.engine import Engine, Finished, Request
from tests.conftest import tiny_config
from tests.models.test_ouro import tiny as tiny_ouro

EXITS = (None, "kl:5e-4", "latent-diff:0.3", "cosine:1e-3", "entropy-diff:1e-2", "argmax-stability:3")


def prompts(count: int, vocab: int = 96, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 20, (count,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def served(engine: Engine, requests: list[tuple[list[int], dict]]) -> list[tuple[list[int], list[int], str]]:
    """Runs the engine (in this thread) until every request ends: tokens, depths and finish reason of each."""
    submitted = [
        engine.submit(Request(prompt, GenerationConfig(**settings))) for prompt, settings in requests
    ]
    while engine.busy:
        engine.step()
    results = []
    for request in submitted:
        tokens, end = request.tokens()
        results.append(([t.id for t in tokens], [t.steps for t in tokens], end.reason))
    return results


def alone(
    model, prompt: list[int], settings: dict, kv_share: int | None = None
) -> tuple[list[int], list[int]]:
    out = generate(model, torch.tensor([prompt]), kv_share=kv_share, **settings)
    return out.sequences[0, len(prompt) :].tolist(), out.steps[0].tolist()


@pytest.fixture(scope="module")
def huginn() -> RecurrentDepthLM:
    torch.manual_seed(0)
    return RecurrentDepthLM(tiny_config()).eval()


@pytest.mark.parametrize(("max_batch", "kv_share"), [(16, None), (3, None), (4, 4)])
def test_huginn_rows_at_their_own_depth_and_exit_match_generate_alone(huginn, max_batch, kv_share):
    # 16 requests of different lengths, depths 1-32, every exit criterion and continuous thought; with a
    # batch of 3 or 4, requests join and leave the running batch between tokens.
    requests = [
        (
            prompt,
            dict(
                max_new_tokens=5 + i % 7,
                num_steps=1 + (i * 5) % 32,
                init_scale=0.0,
                exit=EXITS[i % len(EXITS)],
                continuous=i % 5 == 4,
            ),
        )
        for i, prompt in enumerate(prompts(16))
    ]
    results = served(Engine(huginn, max_batch=max_batch, kv_share=kv_share), requests)
    for (prompt, settings), (tokens, depths, reason) in zip(requests, results, strict=True):
        assert (tokens, depths) == alone(huginn, prompt, settings, kv_share), settings
        assert reason == "length"
    assert any(
        depth < settings["num_steps"]
        for (_, settings), (_, d, _) in zip(requests, results, strict=True)
        for depth in d
    )


def test_ouro_rows_with_gate_exits_match_generate_alone():
    model = tiny_ouro(vocab=96)
    exits = (None, "gate:0.5", "gate-full:0.5", "kl:1e-3")
    requests = [
        (prompt, dict(max_new_tokens=4 + i % 6, num_steps=1 + i % 8, exit=exits[i % 4]))
        for i, prompt in enumerate(prompts(16))
    ]
    results = served(Engine(model, max_batch=5), requests)
    for (prompt, settings), (tokens, _, _) in zip(requests, results, strict=True):
        assert tokens == alone(model, prompt, settings)[0], settings


def test_a_stop_token_ends_its_row_and_the_others_go_on(huginn):
    prompt = prompts(1)[0]
    free, _ = alone(huginn, prompt, dict(max_new_tokens=8, init_scale=0.0))
    stop = free[2]
    results = served(
        Engine(huginn),
        [
            (prompt, dict(max_new_tokens=8, init_scale=0.0, stop_tokens=(stop,))),
            (prompt, dict(max_new_tokens=8, init_scale=0.0)),
        ],
    )
    assert results[0][0] == free[: free.index(stop) + 1] and results[0][2] == "stop"
    assert results[1][0] == free and results[1][2] == "length"


def test_sampled_rows_follow_their_seed_not_their_neighbours(huginn):
    settings = GenerationConfig(max_new_tokens=10, do_sample=True, temperature=1.5, init_scale=0.0)
    prompt = prompts(1)[0]

    def sample(neighbours: int) -> list[int]:
        engine = Engine(huginn)
        mine = engine.submit(Request(prompt, settings, seed=7))
        for other in prompts(neighbours, seed=9):
            engine.submit(Request(other, settings))
        while engine.busy:
            engine.step()
        return [t.id for t in mine.tokens()[0]]

    assert sample(0) == sample(5)
    assert sample(0) != [t.id for t in _run_one(huginn, prompt, settings, seed=8)]


def _run_one(model, prompt, settings, seed):
    engine = Engine(model)
    request = engine.submit(Request(prompt, settings, seed=seed))
    while engine.busy:
        engine.step()
    return request.tokens()[0]


def test_a_cancelled_request_leaves_the_batch(huginn):
    engine = Engine(huginn)
    keep = engine.submit(Request(prompts(1)[0], GenerationConfig(max_new_tokens=6, init_scale=0.0)))
    leave = engine.submit(Request(prompts(2)[1], GenerationConfig(max_new_tokens=50, init_scale=0.0)))
    engine.step()
    engine.step()
    leave.cancel()
    engine.step()
    assert len(engine.rows) == 1
    while engine.busy:
        engine.step()
    tokens, end = leave.tokens()
    assert end == Finished("cancelled") and len(tokens) == 2
    assert keep.tokens()[1].reason == "length"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(max_new_tokens=200), "exceed the model's context of 128"),
        (dict(exit="gate:0.5"), "gate"),
        (dict(kv_share=2), "cannot set kv_share"),
        (dict(exit="nope:1"), "unknown exit criterion"),
    ],
)
def test_requests_it_cannot_serve_are_refused_when_submitted(huginn, settings, message):
    with pytest.raises(UsageError, match=message):
        Engine(huginn).submit(Request([1, 2, 3], GenerationConfig(**settings)))


def test_prompt_ids_outside_the_vocabulary_are_refused(huginn):
    with pytest.raises(UsageError, match=r"\[0, 96\)"):
        Engine(huginn).submit(Request([1, 96], GenerationConfig()))


def test_close_drains_requests_in_flight(huginn):
    engine = Engine(huginn, max_batch=2).start()
    requests = [
        engine.submit(Request(p, GenerationConfig(max_new_tokens=5, init_scale=0.0))) for p in prompts(5)
    ]
    closer = threading.Thread(target=engine.close)
    closer.start()
    closer.join(timeout=120)
    assert not closer.is_alive()
    assert [r.tokens()[1].reason for r in requests] == ["length"] * 5
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.submit(Request([1, 2], GenerationConfig()))


def test_a_prompt_whose_prefill_fails_ends_only_its_own_request(huginn):
    class Failing(Engine):
        def _prefill(self, request):
            if request.prompt == [9, 9, 9]:
                raise RuntimeError("boom")
            return super()._prefill(request)

    engine = Failing(huginn)
    good = engine.submit(Request([1, 2, 3], GenerationConfig(max_new_tokens=3, init_scale=0.0)))
    bad = engine.submit(Request([9, 9, 9], GenerationConfig(max_new_tokens=3, init_scale=0.0)))
    while engine.busy:
        engine.step()
    assert bad.tokens() == ([], Finished("error", "RuntimeError: boom"))
    assert good.tokens()[1] == Finished("length")
