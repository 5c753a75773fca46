"""The OpenAI-compatible server: the same tokens as ``generate``, the shapes clients read, 400s for bad input,
and real clients (the openai package) over a socket."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from latentloop.data.tokenizers import ByteTokenizer
from latentloop.models.generation import generate
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.nn.quantized import is_quantized
from latentloop.serve.engine import Engine
from latentloop.serve.loading import load_served
from latentloop.serve.openai_api import Served, create_app
from latentloop.serve.scoring import prompt_logprobs
from tests.conftest import tiny_config

TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}<{{ m['role'] }}>{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def model() -> RecurrentDepthLM:
    torch.manual_seed(0)
    return RecurrentDepthLM(tiny_config(vocab_size=259)).eval()


def make_served(model, **options) -> Served:
    return Served(
        Engine(model, max_batch=options.pop("max_batch", 8)), ByteTokenizer(), "tiny", TEMPLATE, 0.0
    )


@pytest.fixture
def client(model):
    with TestClient(create_app(make_served(model))) as client:
        yield client


def reference(model, text: str, ignore_eos: bool = False, **settings) -> str:
    ids = list(text.encode())
    stops = () if ignore_eos else (258,)
    out = generate(model, torch.tensor([ids]), init_scale=0.0, stop_tokens=stops, **settings)
    return ByteTokenizer().decode(out.sequences[0, len(ids) :].tolist())


def test_completion_is_generate_at_the_requested_depth(client, model):
    for depth in (1, 3, 8):
        body = {"model": "tiny", "prompt": "The cat", "max_tokens": 12, "temperature": 0, "num_steps": depth}
        body["ignore_eos"] = True
        reply = client.post("/v1/completions", json=body).json()
        assert reply["object"] == "text_completion"
        expected = reference(model, "The cat", True, max_new_tokens=12, num_steps=depth)
        assert reply["choices"][0]["text"] == expected
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"] == {
            "prompt_tokens": 7,
            "completion_tokens": 12,
            "total_tokens": 19,
            "mean_depth": depth,
        }


def test_usage_reports_the_depth_an_exit_criterion_saved(client, model):
    body = {
        "prompt": "abc",
        "max_tokens": 10,
        "temperature": 0,
        "num_steps": 16,
        "exit": "latent-diff:0.5",
        "ignore_eos": True,
    }
    reply = client.post("/v1/completions", json=body).json()
    out = generate(
        model,
        torch.tensor([list(b"abc")]),
        max_new_tokens=10,
        num_steps=16,
        init_scale=0.0,
        exit="latent-diff:0.5",
    )
    assert reply["usage"]["mean_depth"] == pytest.approx(out.mean_steps, abs=1e-4)
    assert reply["usage"]["mean_depth"] < 16


def test_streamed_text_joins_to_the_whole_completion(client):
    body = {"prompt": "Hello", "max_tokens": 10, "temperature": 0, "num_steps": 4}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_strings_cut_the_text(client, model):
    full = reference(model, "The cat", max_new_tokens=12, num_steps=4)
    stop = full[3:5]
    body = {"prompt": "The cat", "max_tokens": 12, "temperature": 0, "num_steps": 4, "stop": [stop]}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == full[: full.index(stop)]
    assert choice["finish_reason"] == "stop"


def test_chat_renders_the_template_and_streams_deltas(client, model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "num_steps": 2}
    reply = client.post("/v1/chat/completions", json=body).json()
    prompt = "<system>Be brief.\n<user>Hi\n<assistant>"
    assert reply["choices"][0]["message"] == {
        "role": "assistant",
        "content": reference(model, prompt, max_new_tokens=8, num_steps=2),
    }
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        == (reply["choices"][0]["message"]["content"])
    )


def test_echo_with_logprobs_scores_the_prompt_at_the_depth_asked(client, model):
    body = {"prompt": "abcd", "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1, "num_steps": 3}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    block = choice["logprobs"]
    assert block["tokens"][:4] == ["a", "b", "c", "d"] and len(block["tokens"]) == 5
    assert block["token_logprobs"][0] is None and block["top_logprobs"][0] is None
    logits = model(torch.tensor([list(b"abcd")]), num_steps=3, init_scale=0.0).logits[0].float()
    expected = torch.log_softmax(logits, -1)[[0, 1, 2], [98, 99, 100]].tolist()
    assert block["token_logprobs"][1:4] == pytest.approx(expected, abs=1e-5)
    assert choice["text"].startswith("abcd")


def test_prompt_logprobs_report_the_top_tokens(model):
    scored = prompt_logprobs(model, [97, 98, 99], 2, 0.0, 3)
    assert scored[0] == (None, ())
    for logprob, top in scored[1:]:
        values = [value for _, value in top]
        assert len(top) == 3 and values == sorted(values, reverse=True) and logprob <= values[0]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": "hi", "model": "other"}, "unknown model 'other'"),
        ({"prompt": "hi", "num_steps": 0}, "num_steps"),
        ({"prompt": "hi", "exit": "kl:-1"}, "must not be negative"),
        ({"prompt": "hi", "exit": "warp"}, "unknown exit criterion"),
        ({"prompt": "hi", "max_tokens": 500}, "exceed the model's context of 128"),
        ({"prompt": ""}, "the prompt is empty"),
        ({"prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": [1, 300]}, r"\[0, 259\)"),
        ({"max_tokens": 3}, "prompt"),
    ],
)
def test_bad_requests_get_a_400_with_one_line(client, body, message):
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 400
    text = reply.json()["error"]["message"]
    assert "\n" not in text
    assert pytest.importorskip("re").search(message, text), text


def test_malformed_json_gets_a_400(client):
    reply = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "the request body is not valid JSON"


def test_chat_without_a_template_or_with_a_role_it_refuses(model):
    served = make_served(model)
    served.chat_template = None
    with TestClient(create_app(served)) as bare:
        reply = bare.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert reply.status_code == 400 and "no chat template" in reply.json()["error"]["message"]
    with TestClient(create_app(make_served(model))) as client:
        reply = client.post("/v1/chat/completions", json={"messages": [{"role": "tool", "content": "x"}]})
    assert reply.status_code == 400 and "unknown role tool" in reply.json()["error"]["message"]


def test_models_health_and_the_tokenizer_endpoints(client):
    assert client.get("/health").json()["status"] == "ok"
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == 128
    assert client.post("/tokenize", json={"prompt": "hé"}).json()["tokens"] == [104, 195, 169]
    assert client.post("/detokenize", json={"tokens": [104, 195, 169]}).json()["prompt"] == "hé"
    assert client.get("/tokenizer_info").json()["eos_token"] == "<eos>"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(model):
    """The app behind uvicorn on a loopback port."""
    uvicorn = pytest.importorskip("uvicorn")
    port = free_port()
    config = uvicorn.Config(create_app(make_served(model)), host="127.0.0.1", port=port, log_level="warning")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    while not instance.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    instance.should_exit = True
    thread.join(timeout=60)


def test_the_openai_client_streaming_and_not(server, model):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server, api_key="none")
    extra = {"num_steps": 4}
    expected = reference(model, "Once", max_new_tokens=10, num_steps=4)
    reply = client.completions.create(
        model="tiny", prompt="Once", max_tokens=10, temperature=0, extra_body=extra
    )
    assert reply.choices[0].text == expected
    stream = client.completions.create(
        model="tiny", prompt="Once", max_tokens=10, temperature=0, stream=True, extra_body=extra
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == expected
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        extra_body=extra,
    )
    assert chat.choices[0].message.content == reference(
        model, "<user>Hi\n<assistant>", max_new_tokens=6, num_steps=4
    )
    with pytest.raises(openai.BadRequestError, match="unknown model"):
        client.completions.create(model="nope", prompt="x", max_tokens=2)


def test_the_deployments_depth_and_exit_apply_where_a_request_sets_none(model):
    served = make_served(model)
    served.num_steps, served.exit = 12, "latent-diff:0.5"
    body = {"prompt": "abc", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    with TestClient(create_app(served)) as client:
        default = client.post("/v1/completions", json=body).json()["usage"]["mean_depth"]
        plain = client.post("/v1/completions", json={**body, "exit": "none"}).json()["usage"]["mean_depth"]
        deeper = client.post("/v1/completions", json={**body, "exit": "none", "num_steps": 20}).json()
    out = generate(
        model,
        torch.tensor([list(b"abc")]),
        max_new_tokens=8,
        num_steps=12,
        init_scale=0.0,
        exit="latent-diff:0.5",
    )
    assert default == pytest.approx(out.mean_steps, abs=1e-4) and default < 12
    assert plain == 12 and deeper["usage"]["mean_depth"] == 20


def test_tokens_as_ids_name_every_generated_token(client, model):
    body = {"prompt": "xyz", "max_tokens": 6, "temperature": 0, "logprobs": 0, "ignore_eos": True}
    block = client.post("/v1/completions", json={**body, "return_tokens_as_token_ids": True}).json()
    out = generate(model, torch.tensor([list(b"xyz")]), max_new_tokens=6, init_scale=0.0)
    ids = out.sequences[0, 3:].tolist()
    assert block["choices"][0]["logprobs"]["tokens"] == [f"token_id:{i}" for i in ids]


def test_an_int8_deployment_serves_the_tokens_of_int8_generation(model, tmp_path):
    """`latentloop serve --weights int8` loads the weights quantized, and its completions are generate's with
    the same weights."""
    model.save_pretrained(tmp_path)
    served = load_served(str(tmp_path), tokenizer=None, weights="int8", init_scale=0.0)
    assert is_quantized(served.engine.model)
    with TestClient(create_app(served)) as client:
        body = {"prompt": "The cat", "max_tokens": 10, "temperature": 0, "num_steps": 3, "ignore_eos": True}
        reply = client.post("/v1/completions", json=body).json()
    expected = reference(model, "The cat", True, max_new_tokens=10, num_steps=3, weights="int8")
    assert reply["choices"][0]["text"] == expected
