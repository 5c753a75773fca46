"""lm-evaluation-harness's ``local-completions`` model against ``latentloop serve`` gives the scores that
``latentloop harness`` gives on the same model and local tasks."""

from __future__ import annotations

import threading
import time

import pytest

from latentloop.data.tokenizers import ByteTokenizer
from latentloop.serve.engine import Engine
from latentloop.serve.openai_api import Served, create_app
from tests.eval.test_harness import DEPTHS, local_tasks, model, offline, run_dir  # noqa: F401 - fixtures
from tests.serve.test_openai_api import free_port

pytest.importorskip("lm_eval")
uvicorn = pytest.importorskip("uvicorn")


def serving(lm, depth: int, template: str | None = None):
    served = Served(
        Engine(lm, max_batch=4), ByteTokenizer(), "tiny", template, init_scale=0.0, num_steps=depth
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(served), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}/v1/completions"


@pytest.mark.parametrize("depth", DEPTHS)
def test_local_completions_scores_equal_the_harness(model, local_tasks, depth):  # noqa: F811
    import lm_eval
    import lm_eval.models.openai_completions  # registers local-completions

    from latentloop.eval.harness import task_manager

    folder, _, expected = local_tasks
    server, thread, url = serving(model, depth)
    try:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={"base_url": url, "model": "tiny", "num_concurrent": 2, "max_retries": 1},
            tasks=["tiny_mc", "tiny_gen"],
            task_manager=task_manager(folder),
            bootstrap_iters=0,
        )["results"]
    finally:
        server.should_exit = True
        thread.join()
    assert results["tiny_mc"]["acc,none"] == pytest.approx(expected[depth]["tiny_mc"])
    assert results["tiny_gen"]["exact_match,none"] == pytest.approx(expected[depth]["tiny_gen"])


def test_local_chat_completions_scores_generation_as_the_harness(model, local_tasks):  # noqa: F811
    import lm_eval
    import lm_eval.models.openai_completions  # registers local-chat-completions

    from latentloop.eval.harness import task_manager

    folder, _, expected = local_tasks
    server, thread, url = serving(model, 1, template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    try:
        results = lm_eval.simple_evaluate(
            model="local-chat-completions",
            model_args={"base_url": url.replace("/completions", "/chat/completions"), "model": "tiny"},
            tasks=["tiny_gen"],
            task_manager=task_manager(folder),
            apply_chat_template=True,
            bootstrap_iters=0,
        )["results"]
    finally:
        server.should_exit = True
        thread.join()
    assert expected[1]["tiny_gen"] == pytest.approx(1 / 3)  # one of three right: a score that can move
    assert results["tiny_gen"]["exact_match,none"] == pytest.approx(expected[1]["tiny_gen"])
