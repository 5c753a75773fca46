"""``latentloop bench``: the checkout's benchmark scripts, listed and run by name with their own arguments."""

from __future__ import annotations

import json

import torch
from torch import nn

from latentloop.benchmarks.int8_decoding import bytes_per_token
from latentloop.cli import main
from latentloop.data.labels import IGNORE_LABEL
from latentloop.eval.metrics import heldout_metric
from latentloop.models.generation import generate
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.nn.quantized import quantize_weights
from latentloop.tasks.arithmetic import ArithmeticTask
from latentloop.tasks.text import TextTask
from latentloop.train.checkpoint import resolve_checkpoint
from latentloop.train.loop import train
from latentloop.train.run_config import build_run_config
from tests.conftest import tiny_config
from tests.tiny import TINY_LM


def test_list_names_every_script_with_what_it_measures(capsys):
    assert main(["bench", "--list"]) == 0
    rows = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.strip().splitlines())
    assert {"reasoners", "sampling", "generation", "train_throughput"} <= set(rows)
    assert rows["reasoners"].startswith("Reasoner benchmarks on N-Queens")


def test_an_unknown_benchmark_is_one_line_and_exit_2(capsys):
    assert main(["bench", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown benchmark 'nope'" in err[0] and "reasoners" in err[0]


def test_the_arguments_after_the_name_and_the_exit_status_are_the_scripts(tmp_path, monkeypatch, capsys):
    (tmp_path / "echo_args.py").write_text(
        '"""Echoes its arguments."""\nimport sys\nprint(sys.argv[1:])\nsys.exit(3 if "--fail" in sys.argv else 0)\n'
    )
    monkeypatch.setenv("LATENTLOOP_BENCHMARKS", str(tmp_path))
    assert main(["bench", "echo_args", "--repeats", "2", "--help"]) == 0
    assert capsys.readouterr().out.strip() == "['--repeats', '2', '--help']"
    assert main(["bench", "echo_args", "--fail"]) == 3
    assert main(["bench", "--list"]) == 0 and "Echoes its arguments." in capsys.readouterr().out


def test_a_real_benchmark_runs_and_writes_its_json(tmp_path, capsys):
    out = tmp_path / "reasoners.json"
    threads = torch.get_num_threads()  # the script sets torch's thread count for the whole process
    argv = [
        "--models",
        "direct",
        "--compile-models",
        "direct",
        "--skip",
        "sampling",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--batch-size",
        "2",
    ]
    assert main(["bench", "reasoners", *argv, "--threads", str(threads), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report == json.loads(capsys.readouterr().out)
    assert report["train"]["models"]["direct"]["examples_per_s"] > 0
    assert report["compile"]["models"]["direct"]["speedup_compiled"] > 0


def test_a_benchmark_refuses_a_bad_argument_in_one_line(capsys):
    assert main(["bench", "reasoners", "--repeats", "many"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: argument --repeats: expected a whole number, got 'many' (see --help)"]


def test_gram_guidance_reports_every_hand_over_step_and_refuses_a_deterministic_run(tmp_path, capsys):
    from latentloop.train.loop import train
    from latentloop.train.run_config import build_reasoner_config
    from tests.tiny import TINY_REASONER, tiny_run

    for arch in ("gram", "trm"):
        data = tiny_run(TINY_REASONER, arch=arch, train={"steps": 1, "eval_size": 0})
        train(build_reasoner_config(data), tmp_path / arch)
    capsys.readouterr()
    assert main(["bench", "gram_guidance", str(tmp_path / "gram"), "--limit", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    steps = TINY_REASONER["model"]["n_sup"]
    assert report["puzzles"] == 4 and report["steps"] == steps
    assert list(report["valid_by_posterior_steps"]) == [str(k) for k in range(steps + 1)]
    assert all(0.0 <= v <= 1.0 for v in report["valid_by_posterior_steps"].values())
    assert len(report["posterior"]["kl_per_step"]) == steps and min(report["posterior"]["kl_per_step"]) >= 0
    assert main(["bench", "gram_guidance", str(tmp_path / "trm")]) == 2
    assert "a GRAM run is needed" in capsys.readouterr().err


def test_the_parallel_sampler_benchmark_prompts_a_text_run_with_its_held_out_windows(tmp_path, capsys):
    config = build_run_config({**TINY_LM, "task": {"name": "text", "seq_len": 16}}, ["train.steps=2"])
    run = tmp_path / "run"
    train(config, run)
    task = TextTask(seq_len=16)
    windows = next(iter(task.heldout_batches(2, 2)))[0]
    argv = ["--model", str(run), "--prompts", "2", "--prompt-tokens", "6", "--num-steps", "3"]
    out = tmp_path / "parallel.json"
    assert main(["bench", "parallel_sampler", *argv, "--max-new-tokens", "4", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["prompts"] == 2 and report["num_steps"] == 3
    assert report["settings"]["limit"]["exact_share"] == 1.0  # the limit setting is sequential decoding
    # The prompts are the opening tokens of the held-out windows, continued greedily at the full depth; the
    # sequential early exit's agreement is the mean over them of its tokens matching that continuation.
    model = RecurrentDepthLM.from_pretrained(resolve_checkpoint(run)).eval()
    settings = dict(max_new_tokens=4, num_steps=3, init_scale=0.0, kv_share=1)
    agreements = []
    for example, window in zip(report["examples"], windows, strict=True):
        assert example["prompt"] == window[:6].tolist()
        expected = generate(model, window[None, :6], **settings).sequences[0, 6:]
        assert example["sequential"] == expected.tolist()
        early = generate(model, window[None, :6], exit="latent-diff:0.03", **settings).sequences[0, 6:]
        agreements.append(float((early == expected).float().mean()))
    assert report["sequential_latent_diff"]["token_agreement"] == sum(agreements) / 2


def test_a_negative_or_zero_count_is_one_line_and_exit_2_for_every_script(capsys):
    cases = [
        (["reasoners", "--threads", "-1"], "argument --threads: must be at least 1, got -1"),
        (["reasoners", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["generation", "--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
        (["sampling", "--samples", "-3"], "argument --samples: must be at least 0, got -3"),
        (["train_throughput", "--steps", "two"], "argument --steps: expected a whole number, got 'two'"),
    ]
    for args, message in cases:
        assert main(["bench", *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {message} (see --help)"], args


def test_the_clients_benchmark_refuses_what_it_cannot_score(tmp_path, capsys, gram_run):
    for argv, message in (
        (["--model", str(tmp_path / "nowhere")], "does not exist"),
        (["--model", str(gram_run)], "not arithmetic"),
        (["--model", str(gram_run), "--depths", "1,0"], "must be at least 1"),
    ):
        assert main(["bench", "serving_clients", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_int8_quality_compares_the_run_with_its_quantized_copy(tmp_path, capsys):
    run = tmp_path / "run"
    train(build_run_config(TINY_LM), run)
    out = tmp_path / "quality.json"
    argv = ["--model", str(run), "--depths", "1,3", "--limit", "8", "--tokens", "3", "--threads", "1"]
    assert main(["bench", "int8_quality", *argv, "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    fp32 = RecurrentDepthLM.from_pretrained(resolve_checkpoint(run)).eval()
    int8 = quantize_weights(fp32).eval()
    task = ArithmeticTask(**{k: v for k, v in report["task"].items() if k != "name"})
    inputs, labels, _ = next(iter(task.heldout_batches(64, 8)))
    scored = labels != IGNORE_LABEL
    with torch.inference_mode():
        for row in report["rows"]:
            depth = row["depth"]
            assert row["fp32_exact_match"] == heldout_metric(fp32, task, depth, limit=8)["exact_match"]
            assert row["int8_exact_match"] == heldout_metric(int8, task, depth, limit=8)["exact_match"]
            a = fp32(inputs, num_steps=depth, init_scale=0.0).logits[scored].argmax(-1)
            b = int8(inputs, num_steps=depth, init_scale=0.0).logits[scored].argmax(-1)
            assert row["positions"] == int(scored.sum())
            assert row["greedy_agreement"] == round(float((a == b).float().mean()), 5)


def test_the_bytes_a_token_reads_grow_by_the_core_at_each_step():
    torch.manual_seed(0)
    model = RecurrentDepthLM(tiny_config()).eval()
    prompt = torch.randint(1, 90, (1, 8))
    core = [
        model.transformer.adapter,
        *(m for m in model.transformer.core_block.modules() if isinstance(m, nn.Linear)),
    ]
    per_step = sum(layer.weight.numel() * 4 for layer in core)
    with torch.inference_mode():
        one, three = (bytes_per_token(model, prompt, depth) for depth in (1, 3))
        assert three - one == 2 * per_step
        int8 = quantize_weights(model)
        scales = sum(layer.weight.shape[0] * 4 for layer in core)
        assert bytes_per_token(int8, prompt, 3) - bytes_per_token(int8, prompt, 1) == 2 * (
            per_step // 4 + scales
        )


def test_int8_decoding_refuses_an_unknown_shape_in_one_line(capsys):
    assert main(["bench", "int8_decoding", "--shapes", "llama-70b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown shape 'llama-70b'" in err[0]
