"""The server under load and shutdown: 64 concurrent clients over loopback (streaming and not, some leaving
mid-stream), and SIGTERM while a request streams."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from latentloop.models.recurrent_depth import RecurrentDepthLM
from tests.conftest import tiny_config
from tests.serve.test_openai_api import free_port, make_served

httpx = pytest.importorskip("httpx")

# Bounds a hang, not a speed: every request here takes well under a second.
HANG = 300.0


async def one_client(client, index: int) -> str:
    body = {
        "prompt": f"client {index}",
        "max_tokens": 4 + index % 5,
        "temperature": 0,
        "num_steps": 1 + index % 4,
    }
    body["ignore_eos"] = True
    if index % 3 == 0:
        reply = await client.post("/v1/completions", json=body)
        return (
            "ok"
            if reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == body["max_tokens"]
            else f"bad {reply.status_code}"
        )
    if index % 3 == 1:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
            lines = [line async for line in reply.aiter_lines() if line.startswith("data: ")]
        return (
            "ok" if reply.status_code == 200 and lines[-1] == "data: [DONE]" else f"bad {reply.status_code}"
        )
    body["max_tokens"] = 100  # leaves after the first chunk: its slot must come free
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                break
    return "left"


def test_64_concurrent_clients_all_end_cleanly_and_leave_nothing_behind(server_app):
    url, served = server_app

    async def everyone() -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as client:
            return await asyncio.gather(*(one_client(client, i) for i in range(64)))

    outcomes = asyncio.run(everyone())
    assert outcomes.count("ok") == 43 and outcomes.count("left") == 21
    with httpx.Client(base_url=url, timeout=HANG) as client:
        while client.get("/health").json()["requests"]:  # the engine notices the last departures
            time.sleep(0.05)
    assert served.engine.rows == [] and served.engine.cache is None


@pytest.fixture
def server_app():
    uvicorn = pytest.importorskip("uvicorn")
    from latentloop.serve.openai_api import create_app

    torch.manual_seed(0)
    served = make_served(RecurrentDepthLM(tiny_config(vocab_size=259)).eval(), max_batch=16)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", served
    server.should_exit = True
    thread.join(timeout=HANG)


def test_sigterm_drains_the_request_in_flight(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "model"
    RecurrentDepthLM(tiny_config(vocab_size=259, block_size=2048)).save_pretrained(folder)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "latentloop",
        "serve",
        str(folder),
        "--port",
        str(port),
        "--init-scale",
        "0",
    ]
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=HANG) as client:
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            body = {"prompt": "drain", "max_tokens": 1500, "temperature": 0, "num_steps": 4, "stream": True}
            body["ignore_eos"] = True
            with client.stream("POST", "/v1/completions", json=body) as reply:
                lines = reply.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                process.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line.startswith("data: ")]
        chunks = [json.loads(line[6:]) for line in [first, *rest[:-1]]]
        assert rest[-1] == "data: [DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        # uvicorn ends by raising the signal it caught again, once the requests in flight are done
        assert process.wait(timeout=HANG) in (0, -signal.SIGTERM)
        assert "Traceback" not in process.stderr.read()
    finally:
        process.kill()
