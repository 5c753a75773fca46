"""Through latentloop's vLLM plugin, vLLM gives latentloop's ``generate``'s greedy tokens, in one batch of 16
requests of different lengths, at every depth, and with Ouro's exit gate.

vLLM runs in its own environment (``scripts/setup-vllm.sh`` builds ``.venv-vllm``; ``.ci/run`` runs this file
there); elsewhere the file is skipped.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

# One process (no engine subprocess) and a small cache, set before vLLM reads them.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
vllm = pytest.importorskip("vllm")

from latentloop.data.tokenizers import ByteTokenizer  # noqa: E402
from latentloop.models.ouro import OuroConfig, OuroLM  # noqa: E402
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM  # noqa: E402
from tests.serve.test_openai_api import free_port  # noqa: E402

NEW_TOKENS = 8
HANG = 600  # seconds a server may take to start before a test calls it hung


def prompts(count: int = 16, vocab: int = 512, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (count,), generator=generator).tolist()
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def alone(model: torch.nn.Module, prompt: list[int], **settings) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, **settings)
    return out[0, len(prompt) :].tolist()


def served(folder, requests: list[list[int]], **overrides) -> list[list[int]]:
    """Greedy tokens of vLLM serving ``folder`` with ``overrides`` on its config, all requests in one batch."""
    llm = vllm.LLM(
        str(folder),
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=128,
        enforce_eager=True,
        hf_overrides=overrides,
    )
    try:
        params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0, detokenize=False, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in requests], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def huginn(tmp_path_factory) -> tuple[RecurrentDepthLM, object]:
    torch.manual_seed(0)
    config = RecurrentDepthConfig(
        n_embd=128, n_heads=2, intermediate_size=256, vocab_size=512, block_size=256, mean_recurrence=4
    )
    model = RecurrentDepthLM(config).eval()
    with torch.no_grad():  # a trained-looking qk bias, so that its loading is checked too
        for block in model.transformer.core_block:
            block.attn.qk_bias.normal_(std=0.5)
    folder = tmp_path_factory.mktemp("huginn")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def ouro(tmp_path_factory) -> tuple[OuroLM, object]:
    torch.manual_seed(0)
    config = OuroConfig(
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=256,
        num_hidden_layers=2,
        vocab_size=512,
        max_position_embeddings=256,
        total_ut_steps=4,
        early_exit_threshold=None,
    )
    model = OuroLM(config).eval()
    with torch.no_grad():  # a gate whose exit probabilities differ from token to token
        model.model.early_exit_gate.weight.normal_(std=0.3)
    folder = tmp_path_factory.mktemp("ouro")
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize("depth", [1, 3, 32])
def test_huginn_layout_gives_generate_tokens_at_the_deployment_depth(huginn, depth):
    model, folder = huginn
    requests = prompts()
    expected = [alone(model, p, num_steps=depth, init_scale=0.0) for p in requests]
    assert served(folder, requests, mean_recurrence=depth) == expected


def test_huginn_depth_changes_the_tokens(huginn):
    # Guards the test above: a plugin that ignored the depth would fail one of its cases.
    model, _ = huginn
    requests = prompts()
    assert [alone(model, p, num_steps=1, init_scale=0.0) for p in requests] != [
        alone(model, p, num_steps=32, init_scale=0.0) for p in requests
    ]


@pytest.mark.parametrize("steps", [1, 4, 8])
def test_ouro_layout_gives_generate_tokens_at_the_deployment_depth(ouro, steps):
    model, folder = ouro
    requests = prompts()
    expected = [alone(model, p, num_steps=steps) for p in requests]
    assert served(folder, requests, total_ut_steps=steps) == expected


@pytest.mark.parametrize("threshold", [0.5, 0.9])
def test_ouro_exit_gate_picks_each_tokens_step_as_the_reference_does(ouro, threshold):
    model, folder = ouro
    requests = prompts()
    with torch.no_grad():
        exits = model(torch.tensor([requests[0]]), exit_threshold=threshold).exit_steps
    assert len(set(exits.flatten().tolist())) > 1  # tokens of one request exit at different steps
    expected = [alone(model, p, num_steps=4, exit=f"gate-full:{threshold}") for p in requests]
    assert expected != [alone(model, p, num_steps=4) for p in requests]
    assert served(folder, requests, total_ut_steps=4, early_exit_threshold=threshold) == expected


def test_a_config_the_plugin_cannot_serve_fails_with_its_reason(huginn):
    _, folder = huginn
    with pytest.raises(Exception, match="mean_recurrence must be at least 1"):
        served(folder, prompts(1), mean_recurrence=0)


TENSOR_PARALLEL = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    folder, requests, overrides, new_tokens = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
    llm = LLM(folder, dtype="float32", skip_tokenizer_init=True, max_model_len=128, enforce_eager=True,
              tensor_parallel_size=2, hf_overrides=overrides)
    params = SamplingParams(max_tokens=new_tokens, temperature=0, detokenize=False, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in requests], params, use_tqdm=False)
    print("tokens:", json.dumps([list(o.outputs[0].token_ids) for o in outputs]))
"""


@pytest.mark.parametrize("family", ["huginn", "ouro"])
def test_two_tensor_parallel_ranks_give_the_same_tokens(family, huginn, ouro, tmp_path):
    # Each rank holds half of every layer's heads (the qk bias too) and of the MLP; one worker per core.
    model, folder = huginn if family == "huginn" else ouro
    overrides = (
        {"mean_recurrence": 3} if family == "huginn" else {"total_ut_steps": 4, "early_exit_threshold": 0.5}
    )
    settings = (
        dict(num_steps=3, init_scale=0.0) if family == "huginn" else dict(num_steps=4, exit="gate-full:0.5")
    )
    requests = prompts(4)
    script = tmp_path / "tensor_parallel.py"
    script.write_text(TENSOR_PARALLEL)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(folder),
            json.dumps(requests),
            json.dumps(overrides),
            str(NEW_TOKENS),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    served = [line.removeprefix("tokens:") for line in done.stdout.splitlines() if line.startswith("tokens:")]
    assert json.loads(served[-1]) == [alone(model, p, **settings) for p in requests]


# `vllm serve` of an exported run, with its tokenizer: the openai client and lm-evaluation-harness -------------
SERVED_DEPTH = 3
CHAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A recurrent-depth LM with vLLM's smallest head (64) trained a few steps on arithmetic, exported with its
    byte tokenizer and a chat template that joins the messages."""
    from latentloop.cli import main
    from latentloop.train.loop import train
    from latentloop.train.run_config import build_run_config
    from tests.tiny import TINY_LM, tiny_run

    root = tmp_path_factory.mktemp("exported")
    config = tiny_run(
        TINY_LM, model={"n_embd": 128, "n_heads": 2, "intermediate_size": 256}, train={"steps": 20}
    )
    train(build_run_config(config), root / "run")
    (root / "chat.jinja").write_text(CHAT)
    assert (
        main(
            [
                "export",
                str(root / "run"),
                "--out",
                str(root / "served"),
                "--chat-template",
                str(root / "chat.jinja"),
            ]
        )
        == 0
    )
    return RecurrentDepthLM.from_pretrained(root / "served").eval(), root / "served"


@pytest.fixture(scope="module")
def vllm_server(exported, tmp_path_factory):
    """vLLM's OpenAI server on the exported folder at depth 3, as a user starts it; its base URL."""
    import httpx

    _, folder = exported
    port = free_port()
    overrides = json.dumps({"mean_recurrence": SERVED_DEPTH})
    # vllm-cpu 0.32's `vllm` command looks up the version of a distribution named vllm and stops; the server's
    # module runs the same server under both distributions.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--port", str(port), "--dtype", "float32", "--max-model-len", "32", "--enforce-eager"]
    command += ["--hf-overrides", overrides]
    command += ["--served-model-name", "tiny"]
    log = tmp_path_factory.mktemp("vllm-serve") / "log.txt"
    with open(log, "w") as stream:  # a file, not a pipe: a full pipe would stall the server
        server = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(HANG):  # bounds a hang, not a speed
            if server.poll() is not None:
                raise AssertionError(f"vLLM's server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        else:
            raise AssertionError(f"vLLM's server did not start: {log.read_text()[-2000:]}")
        yield base
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def greedy(model, prompt: str, tokens: int) -> str:
    tok = ByteTokenizer()
    out = model.generate(
        torch.tensor([tok.encode(prompt)]),
        max_new_tokens=tokens,
        num_steps=SERVED_DEPTH,
        init_scale=0.0,
        stop_tokens=[tok.eos_id],
    )
    new = out[0, len(tok.encode(prompt)) :].tolist()
    return tok.decode(new[: new.index(tok.eos_id)] if tok.eos_id in new else new)


def test_the_openai_client_gets_generate_text_streaming_and_not(exported, vllm_server):
    openai = pytest.importorskip("openai")
    model, _ = exported
    client = openai.OpenAI(base_url=f"{vllm_server}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == ["tiny"]
    for prompt in ("12+34=", "5+7=", "98-9="):
        expected = greedy(model, prompt, 8)
        reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        assert reply.choices[0].text == expected
        stream = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in stream) == expected
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0
        )
        assert chat.choices[0].message.content == expected  # the template joins the messages' text


def test_lm_eval_through_vllm_serve_scores_as_latentloop_harness(exported, vllm_server, tmp_path):
    pytest.importorskip("lm_eval")
    import lm_eval
    import lm_eval.models.openai_completions  # registers local-completions

    from latentloop.eval.harness import task_manager
    from tests.eval.test_harness import expected_metrics, write_tasks

    model, folder = exported
    docs = write_tasks(tmp_path / "tasks", model)
    expected = expected_metrics(model, docs, SERVED_DEPTH)
    assert 0 < expected["tiny_mc"] < 1 and 0 < expected["tiny_gen"] < 1  # scores a wrong server would move
    args = {"model": "tiny", "tokenizer_backend": "huggingface", "tokenizer": str(folder), "max_length": 32}
    completions = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={**args, "base_url": f"{vllm_server}/v1/completions", "num_concurrent": 2},
        tasks=["tiny_mc", "tiny_gen"],
        task_manager=task_manager(tmp_path / "tasks"),
        bootstrap_iters=0,
    )["results"]
    assert completions["tiny_mc"]["acc,none"] == pytest.approx(expected["tiny_mc"])
    assert completions["tiny_gen"]["exact_match,none"] == pytest.approx(expected["tiny_gen"])
    chat = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args={"model": "tiny", "base_url": f"{vllm_server}/v1/chat/completions"},
        tasks=["tiny_gen"],
        task_manager=task_manager(tmp_path / "tasks"),
        apply_chat_template=True,
        bootstrap_iters=0,
    )["results"]
    assert chat["tiny_gen"]["exact_match,none"] == pytest.approx(expected["tiny_gen"])
