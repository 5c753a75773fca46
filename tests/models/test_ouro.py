"""Ouro in latentloop: its checkpoint layout (round trip, shards, one-line errors for malformed folders), its loop
as declared (no input injection, the final norm inside the loop, a cache slot per step and layer), the exit
gate as exit criterion ``gate:t`` (the official rule, and the steps it skips are not computed), the tools that
refuse it and why, and the command line and harness on an Ouro folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.models.generation import generate
from latentloop.models.kv_cache import RecurrentKVCache
from latentloop.models.looped_lms import load_looped_lm
from latentloop.models.ouro import OuroConfig, OuroLM, exit_distribution
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ouro_tiny" / "model"


def tiny(vocab: int = 64, **options) -> OuroLM:
    torch.manual_seed(0)
    config = OuroConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=vocab,
        max_position_embeddings=64,
        initializer_range=0.2,
        **options,
    )
    return OuroLM(config).eval()


@pytest.fixture
def folder(tmp_path) -> Path:
    target = tmp_path / "ouro"
    shutil.copytree(FIXTURE, target)
    return target


def test_save_and_load_round_trip_in_the_official_layout(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "m")
    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.weight" in state and "model.early_exit_gate.bias" in state
    assert "model.layers.1.post_attention_layernorm_2.weight" in state
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "ouro"
    loaded = OuroLM.from_pretrained(tmp_path / "m")
    ids = torch.randint(0, 64, (2, 6))
    assert torch.equal(loaded(ids, num_steps=3).logits, model(ids, num_steps=3).logits)


def test_sharded_checkpoint_with_index_loads(tmp_path, folder):
    state = load_file(str(folder / "model.safetensors"))
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, str(folder / name))
    (folder / "model.safetensors").unlink()
    weight_map = {k: name for name, part in shards.items() for k in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ids = torch.randint(0, 64, (1, 5))
    expected = OuroLM.from_pretrained(FIXTURE)(ids).logits
    assert torch.equal(load_looped_lm(folder)(ids).logits, expected)


def malformed(folder: Path, how: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    if how == "missing shard":
        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        save_file(state, str(folder / "model-00001-of-00002.safetensors"))
        weight_map = {k: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, k in enumerate(state)}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return
    if how == "missing key":
        del config["num_hidden_layers"]
    elif how == "unsupported key":
        config["num_key_value_heads"] = 2
    elif how == "wrong shape":
        config["intermediate_size"] = 50
    elif how == "unknown model_type":
        config["model_type"] = "ouro2"
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "how", ["missing shard", "missing key", "unsupported key", "wrong shape", "unknown model_type"]
)
def test_malformed_folder_is_one_error_line_and_exit_2(folder, how, capsys):
    malformed(folder, how)
    before = sorted(p.name for p in folder.iterdir())
    assert main(["generate", str(folder), "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == before


def test_the_loop_reads_no_input_and_normalises_every_step():
    model = tiny()
    assert not model.loop.input_injection and model.loop.exit_gate and not model.loop.random_initial_state
    ids = torch.randint(0, 64, (1, 5))
    ctx = model.context(5)
    embeds = model.embed(ids, ctx)
    state = model.core_step(embeds, embeds, ctx, 0)
    # No injection: the embedding passed alongside the state changes nothing.
    assert torch.equal(
        model.core_step(state, torch.zeros_like(embeds), ctx, 1), model.core_step(state, embeds, ctx, 1)
    )
    rms = state.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(
        rms, torch.ones_like(rms), atol=1e-3, rtol=0
    )  # unit norm weights: the norm's output


def test_cache_keeps_one_entry_per_step_and_layer():
    model = tiny()
    cache = RecurrentKVCache(1, 4, 8, 16)
    model(torch.randint(0, 64, (1, 5)), num_steps=3, cache=cache)
    assert sorted((k.layer, k.slot) for k in cache.keys) == [(j, s) for j in range(2) for s in range(3)]
    assert {k.part for k in cache.keys} == {"core"}


def test_any_depth_and_cache_equal_to_recomputing():
    model = tiny()
    ids = torch.randint(0, 64, (2, 5))
    for steps in (1, 6, 12):
        cached = generate(model, ids, max_new_tokens=5, num_steps=steps).sequences
        assert torch.equal(
            cached, generate(model, ids, max_new_tokens=5, num_steps=steps, use_cache=False).sequences
        )


def gate_rule_by_hand(model: OuroLM, state_per_step: list[torch.Tensor], threshold: float) -> int:
    """The official rule: the first step whose cumulative exit probability reaches the threshold."""
    lambdas = torch.stack([model.exit_lambda(s[:, -1]) for s in state_per_step], dim=-1)[0]
    cumulative = exit_distribution(lambdas).cumsum(-1)
    reached = [i for i in range(len(state_per_step)) if float(cumulative[i]) >= threshold]
    return (reached[0] if reached else len(state_per_step) - 1) + 1


@pytest.mark.parametrize("threshold", [0.3, 0.6, 0.9])
def test_gate_exits_where_the_official_rule_says_and_skips_the_rest(threshold, monkeypatch):
    model = tiny()
    ids = torch.randint(0, 64, (1, 4))
    out = generate(
        model, ids, max_new_tokens=6, num_steps=6, exit=f"gate:{threshold}", return_trajectory=True
    )
    # Every decoded token's spent steps follow the rule computed on a full-depth forward of the same sequence.
    for t, spent in enumerate(out.steps[0, 1:].tolist()):
        prefix = out.sequences[:, : ids.shape[1] + t + 1]
        full = model(prefix, num_steps=6, return_trajectory=True).trajectory
        states = [full[i][:, -1:] for i in range(6)]
        if t == 0 or (out.steps[0, 1 : t + 1] == 6).all():  # earlier tokens at full depth: the same cache
            assert spent == gate_rule_by_hand(model, states, threshold)
    calls = []
    original = model.core_step
    monkeypatch.setattr(model, "core_step", lambda *a: calls.append(1) or original(*a))
    again = generate(model, ids, max_new_tokens=6, num_steps=6, exit=f"gate:{threshold}")
    prefill = 6
    assert len(calls) == prefill + int(again.steps[0, 1:].sum())  # skipped steps are never computed


def greedy_as_the_reference(model: OuroLM, ids: torch.Tensor, tokens: int, steps: int, threshold: float):
    """The reference's inference, whole sequence each time: every step computed, each position read from its
    exit step (``exit_threshold``, which matches the official code on the parity fixture)."""
    for _ in range(tokens):
        logits = model(ids, num_steps=steps, exit_threshold=threshold).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("threshold", [0.3, 0.6, 0.9])
def test_gate_full_gives_the_reference_tokens_and_gate_saves_steps(threshold):
    """gate-full computes every step a later token attends to (the cache the reference has) and reads each token
    at its exit: the reference's tokens, batched. gate stops at the exit: fewer steps, and later tokens attend
    to a cache without the skipped steps."""
    model = tiny()
    ids = torch.randint(0, 64, (2, 4))
    reference = greedy_as_the_reference(model, ids, 8, 6, threshold)
    full = generate(model, ids, max_new_tokens=8, num_steps=6, exit=f"gate-full:{threshold}")
    assert torch.equal(full.sequences, reference)
    skipping = generate(model, ids, max_new_tokens=8, num_steps=6, exit=f"gate:{threshold}")
    assert skipping.mean_steps < 6
    without_gate = generate(model, ids, max_new_tokens=8, num_steps=6).sequences
    assert not torch.equal(reference, without_gate)  # the exit changes the answer, so the check can fail


@pytest.mark.parametrize("threshold", [0.3, 0.6])
def test_gate_full_chooses_each_token_at_its_exit_and_runs_the_later_steps_with_the_next_tokens(
    threshold, monkeypatch
):
    """Each token waits only for the passes up to its exit (the official rule on a full-depth forward of the
    same sequence); its later steps run as extra positions of the next tokens' passes once a later token
    reaches them, so every step a chosen token depends on is computed and the tokens are the reference's."""
    model = tiny()
    ids = torch.randint(0, 64, (1, 4))
    calls = []
    original = model.core_step
    monkeypatch.setattr(
        model, "core_step", lambda state, *a: calls.append(state.shape[1]) or original(state, *a)
    )
    out = generate(model, ids, max_new_tokens=8, num_steps=6, exit=f"gate-full:{threshold}")
    monkeypatch.undo()
    assert torch.equal(out.sequences, greedy_as_the_reference(model, ids, 8, 6, threshold))
    exits = []
    for t in range(1, 8):  # token t was chosen after the pass of the token before it
        full = model(out.sequences[:, : ids.shape[1] + t], num_steps=6, return_trajectory=True).trajectory
        exits.append(gate_rule_by_hand(model, [full[i][:, -1:] for i in range(6)], threshold))
    assert out.passes.tolist() == [6, *exits]
    assert out.mean_passes < 6
    prefill = 6
    assert len(calls) == prefill + sum(exits)  # one core call per pass
    # steps: the iterations each position ran in the end, at least up to its exit; every one was computed once
    assert all(s >= p for s, p in zip(out.steps[0].tolist(), out.passes.tolist(), strict=True))
    assert sum(calls[prefill:]) == int(out.steps[0, 1:].sum())
    assert (max(calls[prefill:]) > 1) == (
        out.steps[0, 1:] > out.passes[1:]
    ).any()  # deferred steps rode along


def test_gate_full_defers_on_prepacked_weights_and_not_where_it_would_change_the_answer():
    model = tiny()
    ids = torch.randint(0, 64, (2, 4))
    plain = generate(model, ids, max_new_tokens=6, num_steps=6, exit="gate-full:0.6")
    packed = generate(model, ids, max_new_tokens=6, num_steps=6, exit="gate-full:0.6", prepack=True)
    assert torch.equal(packed.sequences, plain.sequences) and packed.mean_passes < 6
    # A trajectory needs every step of a token at once; shared slots would let a deferred step overwrite one
    # that a later token's earlier step still reads.
    for options in ({"return_trajectory": True}, {"kv_share": 2}):
        out = generate(model, ids, max_new_tokens=6, num_steps=6, exit="gate-full:0.6", **options)
        assert out.passes is None and out.mean_passes == 6
    trajectory = generate(
        model, ids, max_new_tokens=6, num_steps=6, exit="gate-full:0.6", return_trajectory=True
    )
    assert torch.equal(trajectory.sequences, plain.sequences)


def test_gate_takes_the_config_threshold_and_lower_thresholds_exit_earlier():
    model = tiny(early_exit_threshold=0.5)
    ids = torch.randint(0, 64, (2, 4))
    default = generate(model, ids, max_new_tokens=6, num_steps=6, exit="gate")
    explicit = generate(model, ids, max_new_tokens=6, num_steps=6, exit="gate:0.5")
    assert torch.equal(default.steps, explicit.steps) and torch.equal(default.sequences, explicit.sequences)
    late = generate(model, ids, max_new_tokens=6, num_steps=6, exit="gate:0.99")
    assert default.mean_steps < late.mean_steps


def test_tools_that_need_what_ouro_lacks_refuse_it():
    model = tiny()
    ids = torch.randint(0, 64, (1, 4))
    with pytest.raises(UsageError, match="injects its input"):
        generate(model, ids, max_new_tokens=3, sampler="parallel")
    with pytest.raises(UsageError, match="injects its input"):
        generate(model, ids, max_new_tokens=3, continuous=True)
    with pytest.raises(UsageError, match="random state"):
        generate(model, ids, max_new_tokens=3, num_samples=2, init_scale=1.0)
    huginn = RecurrentDepthLM(RecurrentDepthConfig(n_embd=32, n_heads=4, intermediate_size=48, vocab_size=64))
    with pytest.raises(UsageError, match="exit gate"):
        generate(huginn, ids, max_new_tokens=3, num_steps=2, exit="gate:0.5")


def test_shared_criteria_kv_share_and_speculative_decoding_run_on_ouro():
    model = tiny()
    ids = torch.randint(0, 64, (1, 4))
    full = generate(model, ids, max_new_tokens=5, num_steps=4).sequences
    assert torch.equal(generate(model, ids, max_new_tokens=5, num_steps=4, speculative=2).sequences, full)
    for spec in ("kl", "entropy-diff", "latent-diff", "cosine", "argmax-stability:1"):
        out = generate(model, ids, max_new_tokens=5, num_steps=4, exit=spec)
        assert out.steps.max() <= 4
    shared = generate(model, ids, max_new_tokens=5, num_steps=4, kv_share=2)
    assert shared.sequences.shape == full.shape


def test_generate_command_on_an_ouro_folder(tmp_path, capsys):
    model = tiny(vocab=260)
    model.save_pretrained(tmp_path / "m")
    args = ["generate", str(tmp_path / "m"), "ab", "--max-new-tokens", "4", "--num-steps", "6"]
    assert main([*args, "--exit", "gate:0.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["tokens"]) <= 4 and report["mean_iterations_per_token"] <= 6
    assert main([*args, "--exit", "gate-full:0.3", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["mean_passes_per_token"] <= full["mean_iterations_per_token"] <= 6
    assert full["mean_passes_per_token"] < 6


def test_harness_model_scores_ouro_as_its_forward_pass(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from latentloop.eval.harness import LatentloopLM

    model = tiny(vocab=260)
    model.save_pretrained(tmp_path / "m")
    lm = LatentloopLM(str(tmp_path / "m"), num_steps=3)
    ((ll, _),) = lm.loglikelihood([Instance("loglikelihood", doc={}, arguments=("ab", "c"), idx=0)])
    ids = lm.tokenizer.encode("abc")
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids[:-1]]), num_steps=3).logits[0, -1]
    assert ll == pytest.approx(float(torch.log_softmax(logits, -1)[ids[-1]]), abs=1e-5)
