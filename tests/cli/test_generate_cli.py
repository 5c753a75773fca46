import json

import torch

from latentloop.cli import main
from latentloop.models.recurrent_depth import RecurrentDepthLM
from tests.conftest import tiny_config


def saved_model(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "model"
    RecurrentDepthLM(tiny_config(vocab_size=259 + 5)).save_pretrained(folder)
    return folder


def test_generate_json_reports_text_tokens_speed_and_iterations(tmp_path, capsys):
    folder = saved_model(tmp_path)
    args = [str(folder), "12+34=", "--num-steps", "4", "--max-new-tokens", "5", "--init-scale", "0"]
    assert main(["generate", *args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert set(plain) >= {"text", "tokens", "tokens_per_second", "mean_iterations_per_token"}
    assert len(plain["tokens"]) <= 5 and plain["mean_iterations_per_token"] == 4
    assert main(["generate", *args, "--json", "--exit", "kl:0", "--kv-share", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == plain["tokens"]
    assert main(["generate", *args, "--json", "--speculative", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == plain["tokens"]
    assert main(["generate", *args, "--json", "--compile"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert compiled["tokens"] == plain["tokens"] and compiled["compile"] is True
    limit = ["--sampler", "parallel", "--wavefront", "1", "--inner-steps", "4", "--freeze", "steps"]
    assert main(["generate", *args, "--json", "--kv-share", "1"]) == 0
    one_slot = json.loads(capsys.readouterr().out)["tokens"]
    assert main(["generate", *args, "--json", *limit]) == 0
    parallel = json.loads(capsys.readouterr().out)
    assert parallel["tokens"] == one_slot and parallel["sampler"] == "parallel" and parallel["sweeps"] >= 1


def test_generate_bad_input_exits_2_with_one_line(tmp_path, capsys):
    folder = saved_model(tmp_path)
    cases = [
        [str(tmp_path / "nowhere"), "hi"],
        [str(folder), ""],
        [str(folder), "hi", "--exit", "banana"],
        [str(folder), "hi", "--kv-share", "0"],
        [str(folder), "hi", "--sampler", "beam"],
        [str(folder), "hi", "--sampler", "parallel", "--wavefront", "0"],
        [str(folder), "hi", "--sampler", "parallel", "--freeze", "often"],
        [str(folder), "hi", "--sampler", "parallel", "--speculative", "1"],
        [str(folder), "hi", "--compile", "--speculative", "1"],
    ]
    for args in cases:
        assert main(["generate", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "\n" not in err, err
    (folder / "config.json").write_text(json.dumps({"n_embd": 32, "n_heads": 4}))
    assert main(["generate", str(folder), "hi"]) == 2
    assert "does not match" in capsys.readouterr().err


def test_every_generation_setting_with_a_help_text_is_an_option(tmp_path, capsys):
    """The options are GenerationConfig's and ParallelSampler's fields: one added there is offered here."""
    import dataclasses

    from latentloop.models.generation import GenerationConfig
    from latentloop.models.parallel_sampler import ParallelSampler

    assert main(["generate", "--help"]) == 0
    text = capsys.readouterr().out
    for cls in (GenerationConfig, ParallelSampler):
        for field in dataclasses.fields(cls):
            if field.name == "temperature":  # the command's own: 0 means greedy there
                continue
            flag = "--" + field.name.replace("_", "-")
            assert (flag in text) == ("help" in field.metadata), flag
    folder = saved_model(tmp_path)  # width in latent space, from the command line
    args = [
        str(folder),
        "12+34=",
        "--num-steps",
        "2",
        "--max-new-tokens",
        "3",
        "--num-samples",
        "3",
        "--json",
    ]
    assert main(["generate", *args]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) <= 3
    assert (
        main(["generate", *args[:-2], "--init-scale", "0", "--num-samples", "3"]) == 2
    )  # the config refuses
