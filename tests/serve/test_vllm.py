"""Through latentloop's vLLM plugin, vLLM gives latentloop's ``generate``'s greedy tokens, in one batch of 16
requests of different lengths, at every depth, and with Ouro's exit gate.

vLLM runs in its own environment (``scripts/setup-vllm.sh`` builds ``.venv-vllm``; ``.ci/run`` runs this file
there); elsewhere the file is skipped.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
import torch

# One process (no engine subprocess) and a small cache, set before vLLM reads them.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
vllm = pytest.importorskip("vllm")

from latentloop.models.ouro import OuroConfig, OuroLM  # noqa: E402
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM  # noqa: E402

NEW_TOKENS = 8


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
