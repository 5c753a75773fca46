"""lm-evaluation-harness (latentloop.eval.harness, ``latentloop harness``): the model class scores and generates
exactly what latentloop's own forward pass and ``generate`` give, and a depth sweep over local JSON tasks runs
end to end, offline, on a small trained checkpoint."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import latentloop.eval
from latentloop.cli import main
from latentloop.data.tokenizers import ByteTokenizer
from latentloop.errors import UsageError
from latentloop.models import generation
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.nn.quantized import is_quantized
from latentloop.train.checkpoint import latest_checkpoint
from tests.models.test_ouro import tiny as tiny_ouro
from tests.tiny import TINY_LM

TOK = ByteTokenizer()
DEPTHS = (1, 3)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No downloads: the Hub and datasets are told they are offline, also where already imported."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for module, names in (
        ("datasets.config", ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")),
        ("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
    ):
        if module in sys.modules:
            for name in names:
                if hasattr(sys.modules[module], name):
                    monkeypatch.setattr(sys.modules[module], name, True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The tiny arithmetic LM trained a few steps (block_size 32, byte tokenizer)."""
    from latentloop.train.loop import train
    from latentloop.train.run_config import build_run_config

    run = tmp_path_factory.mktemp("harness") / "run"
    train(build_run_config(TINY_LM), run)
    return run


@pytest.fixture(scope="module")
def model(run_dir) -> RecurrentDepthLM:
    return RecurrentDepthLM.from_pretrained(latest_checkpoint(run_dir)).eval()


def wrapper(model, **options):
    from latentloop.eval.harness import LatentloopLM

    return LatentloopLM(model, **options)


def instances(kind, arguments):
    from lm_eval.api.instance import Instance

    return [Instance(kind, doc={}, arguments=args, idx=0) for args in arguments]


# Direct computations with latentloop's forward pass, one unpadded sequence at a time -----------------------
def scored(model, inputs, targets, depth):
    """Summed log-probability of ``targets`` as the last predictions on ``inputs``, and whether each is argmax."""
    with torch.no_grad():
        logits = model(torch.tensor([inputs]), num_steps=depth, init_scale=0.0).logits[0]
    logprobs = torch.log_softmax(logits, dim=-1)[-len(targets) :]
    target = torch.tensor(targets)
    return float(logprobs.gather(-1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())


def direct_loglikelihood(model, context_ids, continuation_ids, depth, window=32):
    whole = (context_ids + continuation_ids)[-(window + 1) :]
    return scored(model, whole[:-1], continuation_ids, depth)


def greedy_text(model, prompt, depth, max_new_tokens, **options):
    ids = TOK.encode(prompt) or [TOK.eos_id]
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=max_new_tokens,
        num_steps=depth,
        init_scale=0.0,
        stop_tokens=[TOK.eos_id],
        **options,
    )
    new = out[0, len(ids) :].tolist()
    return TOK.decode(new[: new.index(TOK.eos_id)] if TOK.eos_id in new else new)


def greedy_ascii_continuation(model, depth):
    """A (context, one-character continuation) that greedy decoding produces."""
    for context in ("12+34=", "5+7=", "9-3=", "40+2=", "7*8=", "1", "3-9="):
        ids = TOK.encode(context)
        with torch.no_grad():
            token = int(model(torch.tensor([ids]), num_steps=depth, init_scale=0.0).logits[0, -1].argmax())
        if token < 128:
            return context, chr(token)
    raise AssertionError("no candidate context has an ASCII greedy next token")


# The model class ---------------------------------------------------------------------------------------------
def test_loglikelihood_equals_the_forward_pass_in_left_padded_batches(model):
    long_context = "31+45=076 12+13=025 50-8=042 9*9=081"  # longer than the 32-token window
    requests = [
        ("12+34=", "046"),
        ("5+7=", "12"),
        ("", "99"),  # the continuation is conditioned on <eos>, the document separator
        ("9-3= ", "006"),  # the context's trailing space moves to the continuation
        (long_context, "7+7=014"),
    ]
    lm = wrapper(model, batch_size=8)
    by_depth = {}
    for depth in DEPTHS:
        greedy = greedy_ascii_continuation(model, depth)
        lm.num_steps = depth
        got = lm.loglikelihood(instances("loglikelihood", [*requests, greedy]))
        expected = [
            direct_loglikelihood(model, TOK.encode("12+34="), TOK.encode("046"), depth),
            direct_loglikelihood(model, TOK.encode("5+7="), TOK.encode("12"), depth),
            direct_loglikelihood(model, [TOK.eos_id], TOK.encode("99"), depth),
            direct_loglikelihood(model, TOK.encode("9-3="), TOK.encode(" 006"), depth),
            direct_loglikelihood(model, TOK.encode(long_context), TOK.encode("7+7=014"), depth),
            direct_loglikelihood(model, TOK.encode(greedy[0]), TOK.encode(greedy[1]), depth),
        ]
        for (value, is_greedy), (want, want_greedy) in zip(got, expected, strict=True):
            assert value == pytest.approx(want, abs=1e-5)
            assert is_greedy is want_greedy
        assert got[-1][1] is True and got[0][1] is False
        by_depth[depth] = [value for value, _ in got]
    # The depth reaches the forward pass: the scores at depth 1 and 3 differ.
    assert max(abs(a - b) for a, b in zip(by_depth[1], by_depth[3], strict=True)) > 1e-3


def test_loglikelihood_rolling_scores_each_token_once_within_windows(model):
    text = "12+34=046 5+7=012 99"  # 20 tokens: three windows of at most 8
    short = "1+1=02"  # one window, shorter than the others: left padding in the same batch
    lm = wrapper(model, max_length=8, batch_size=4)
    tokens, short_tokens = TOK.encode(text), TOK.encode(short)
    for depth in DEPTHS:
        lm.num_steps = depth
        got = lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(text,), (short,)]))
        eos = TOK.eos_id
        windows = [
            ([eos, *tokens[:7]], tokens[0:8]),  # the first window predicts its every token
            (tokens[7:15], tokens[8:16]),
            (tokens[11:19], tokens[16:20]),  # the last keeps a full context, scores its 4 new tokens
        ]
        want = sum(scored(model, inputs, targets, depth)[0] for inputs, targets in windows)
        want_short = scored(model, [eos, *short_tokens[:-1]], short_tokens, depth)[0]
        assert got[0] == pytest.approx(want, abs=1e-5)
        assert got[1] == pytest.approx(want_short, abs=1e-5)


def test_generate_until_equals_greedy_generate_cut_at_the_stop_string(model):
    prompts = ["12+34=", "5+7=", "", "9-3=111"]
    lm = wrapper(model, batch_size=8)
    for depth in DEPTHS:
        lm.num_steps = depth
        uncut = [greedy_text(model, p, depth, 6) for p in prompts]
        single, multi = uncut[0][1], uncut[0][2:4]  # stop strings of one token and of two
        assert len(uncut[0]) >= 4
        for until in ([single], [multi]):
            kwargs = {"until": until, "max_gen_toks": 6, "do_sample": False}
            got = lm.generate_until(instances("generate_until", [(p, kwargs) for p in prompts]))
            assert got == [text.split(until[0])[0] for text in uncut]
            assert len(got[0]) < len(uncut[0])  # the stop string did cut
        # Without stop strings: up to max_gen_toks or <eos>.
        plain = lm.generate_until(instances("generate_until", [(p, {"max_gen_toks": 6}) for p in prompts]))
        assert plain == uncut


def test_generate_until_passes_on_exit_criterion_and_kv_share(model, monkeypatch):
    seen = []
    real = generation.generate

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate", spy)
    lm = wrapper(model, num_steps=3, exit="latent-diff:0.5", kv_share=2)
    prompts = ["12+34=", "9-3="]
    got = lm.generate_until(instances("generate_until", [(p, {"max_gen_toks": 5}) for p in prompts]))
    assert seen[0]["exit"] == "latent-diff:0.5" and seen[0]["kv_share"] == 2 and seen[0]["num_steps"] == 3
    want = [greedy_text(model, p, 3, 5, exit="latent-diff:0.5", kv_share=2) for p in prompts]
    assert got == want


def test_bad_model_arguments_and_generation_kwargs_are_one_line_errors(model, run_dir):
    for options in (
        {"num_steps": 0},
        {"batch_size": "auto"},
        {"exit": "banana"},
        {"max_length": 64},  # beyond block_size 32
        {"prefix_token_id": 264},
        {"init_scale": -1},
    ):
        with pytest.raises(UsageError):
            wrapper(model, **options)
    with pytest.raises(UsageError, match="device"):
        wrapper(str(run_dir), device="banana")
    with pytest.raises(UsageError, match="does not exist"):
        wrapper(str(run_dir / "nowhere"))
    with pytest.raises(UsageError, match="unknown latentloop model argument"):
        wrapper(model, temperature=0.5)
    lm = wrapper(model)
    with pytest.raises(UsageError, match="num_beams"):
        lm.generate_until(instances("generate_until", [("1+1=", {"num_beams": 4})]))


# End to end: local JSON tasks through simple_evaluate and the command line ---------------------------------
def write_tasks(folder, model) -> dict:
    """Three local tasks (multiple choice, generation, rolling perplexity) whose expected metrics at depth 1
    are set by what the model itself prefers; returns the documents."""
    folder.mkdir()
    mc = [
        {"question": "12+34=", "choices": ["046", "047", "145"]},
        {"question": "5+7=", "choices": ["13", "012", "12"]},
        {"question": "9-3=", "choices": ["006", "-06", "06"]},
    ]
    for doc in mc:  # the model's choice is right for the first and last, wrong for the middle: acc 2/3
        lls = [
            direct_loglikelihood(model, TOK.encode(doc["question"]), TOK.encode(c), 1)[0]
            for c in doc["choices"]
        ]
        best = max(range(3), key=lls.__getitem__)
        doc["label"] = best if doc is not mc[1] else (best + 1) % 3
    gen = [{"question": q} for q in ("12+34=", "5+7=", "9-3=")]
    for doc in gen:  # right for the first only: exact_match 1/3
        text = greedy_text(model, doc["question"], 1, 5).split("\n")[0]
        doc["answer"] = text if doc is gen[0] else text + "x"
    ppl = [{"text": "12+34=046"}, {"text": "5+7=012 and 9-3=006"}]
    common = "dataset_path: json\ntest_split: test\n"
    for name, docs, body in (
        (
            "mc",
            mc,
            "output_type: multiple_choice\ndoc_to_text: question\ndoc_to_choice: choices\n"
            "doc_to_target: label\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc\n",
        ),
        (
            "gen",
            gen,
            "output_type: generate_until\ndoc_to_text: question\ndoc_to_target: answer\n"
            "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 5\n  do_sample: false\n"
            "metric_list:\n  - metric: exact_match\n",
        ),
        (
            "ppl",
            ppl,
            "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: text\n"
            "metric_list:\n  - metric: bits_per_byte\n  - metric: word_perplexity\n",
        ),
    ):
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        files = f"dataset_kwargs:\n  data_files:\n    test: {data}\n  cache_dir: {folder / 'cache'}\n"
        (folder / f"{name}.yaml").write_text(f"task: tiny_{name}\n{common}{files}{body}")
    return {"mc": mc, "gen": gen, "ppl": ppl}


def expected_metrics(model, docs, depth) -> dict[str, float]:
    correct = 0
    for doc in docs["mc"]:
        lls = [
            direct_loglikelihood(model, TOK.encode(doc["question"]), TOK.encode(c), depth)[0]
            for c in doc["choices"]
        ]
        correct += max(range(3), key=lls.__getitem__) == doc["label"]
    matches = sum(
        greedy_text(model, d["question"], depth, 5).split("\n")[0] == d["answer"] for d in docs["gen"]
    )
    total, size = 0.0, 0
    for doc in docs["ppl"]:
        ids = TOK.encode(doc["text"])
        total += scored(model, [TOK.eos_id, *ids[:-1]], ids, depth)[0]
        size += len(doc["text"].encode())
    return {
        "tiny_mc": correct / 3,
        "tiny_gen": matches / 3,
        "tiny_ppl": -total / size / math.log(2),
    }


@pytest.fixture(scope="module")
def local_tasks(model, tmp_path_factory):
    """The task folder, its documents, and the metrics computed directly at each depth."""
    folder = tmp_path_factory.mktemp("lm_eval_tasks") / "tasks"
    docs = write_tasks(folder, model)
    return folder, docs, {depth: expected_metrics(model, docs, depth) for depth in DEPTHS}


def test_depth_sweep_end_to_end_through_the_command_line(run_dir, local_tasks, capsys):
    tasks, _, expected = local_tasks
    args = ["harness", str(run_dir), "--tasks", "tiny_mc,tiny_gen,tiny_ppl", "--depths", "1,3"]
    args += ["--include-path", str(tasks), "--bootstrap-iters", "0", "--batch-size", "4"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_steps"] == [1, 3]
    assert report["metrics"] == {"tiny_mc": "acc", "tiny_gen": "exact_match", "tiny_ppl": "bits_per_byte"}
    assert expected[1]["tiny_mc"] == pytest.approx(2 / 3) and expected[1]["tiny_gen"] == pytest.approx(1 / 3)
    for depth in DEPTHS:
        for task, value in expected[depth].items():
            assert report["table"][task][str(depth)] == pytest.approx(value, rel=1e-6), (task, depth)
        ppl = report["results"][str(depth)]["tiny_ppl"]
        assert ppl["word_perplexity,none"] > 1
    assert report["table"]["tiny_ppl"]["1"] != pytest.approx(report["table"]["tiny_ppl"]["3"])


def test_registered_model_name_and_table(run_dir, model, local_tasks):
    from lm_eval import simple_evaluate

    from latentloop.eval.harness import depth_sweep, format_table, task_manager

    tasks, _, expected = local_tasks
    manager = task_manager(tasks, include_defaults=False)
    out = simple_evaluate(
        model="latentloop",
        model_args={"pretrained": str(run_dir), "num_steps": 3},
        tasks=["tiny_ppl"],
        task_manager=manager,
        bootstrap_iters=0,
    )
    assert out["results"]["tiny_ppl"]["bits_per_byte,none"] == pytest.approx(
        expected[3]["tiny_ppl"], rel=1e-6
    )
    assert out["config"]["num_steps"] == 3

    report = depth_sweep(wrapper(model), ["tiny_mc"], [1, 3], manager=manager, bootstrap_iters=0)
    lines = format_table(report).splitlines()
    assert lines[0].split() == ["task", "metric", "r=1", "r=3"]
    assert lines[1].split()[:2] == ["tiny_mc", "acc"] and lines[1].split()[2] == "0.6667"
    with pytest.raises(UsageError, match="unknown lm-eval task"):
        depth_sweep(wrapper(model), ["tiny_mc", "no_such_task"], [1], manager=manager)
    broken = tasks.parent / "broken"
    broken.mkdir()
    (broken / "bad.yaml").write_text("task: tiny_bad\ndataset_path: json\noutput_type: nonsense\n")
    (broken / "gone.yaml").write_text(
        (tasks / "ppl.yaml").read_text().replace("tiny_ppl", "tiny_gone").replace("ppl.jsonl", "gone.jsonl")
    )
    manager = task_manager(broken, include_defaults=False)
    for name, reason in (("tiny_bad", "output_type"), ("tiny_gone", "gone.jsonl")):
        with pytest.raises(UsageError, match=f"could not load {name}: .*{reason}"):
            depth_sweep(wrapper(model), [name], [1], manager=manager)


# Bad input on the command line -------------------------------------------------------------------------------
def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_without_lm_eval_the_command_says_how_to_install_it(run_dir, monkeypatch, capsys):
    for name in [n for n in sys.modules if n == "lm_eval" or n.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.delitem(sys.modules, "latentloop.eval.harness", raising=False)
    monkeypatch.delattr(latentloop.eval, "harness", raising=False)
    assert main(["harness", str(run_dir), "--tasks", "tiny_mc", "--depths", "1"]) == 2
    line = error_line(capsys)
    assert "lm-eval" in line and "pip install 'latentloop[eval]'" in line


@pytest.mark.parametrize("value", ["0", "a", "1,,4", "-1", "2,2", "", "1.5"])
def test_bad_depths_are_one_line_and_exit_2(run_dir, value, capsys):
    assert main(["harness", str(run_dir), "--tasks", "tiny_mc", "--depths", value]) == 2
    assert "--depths" in error_line(capsys)
    assert (
        main(["harness", str(run_dir), "--tasks", "tiny_mc", "--num-steps", value]) == 2
    )  # deprecated spelling
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("warning: --num-steps is deprecated") and error.startswith("error: --depths")


def test_depth_sweep_on_an_ouro_folder_end_to_end(tmp_path, capsys):
    """The same command on a model in Ouro's official layout, at the depths 1, 2, 4 and 8: every metric is what
    Ouro's own forward pass and ``generate`` give at that depth."""
    ouro = tiny_ouro(vocab=TOK.vocab_size)
    ouro.save_pretrained(tmp_path / "ouro")
    docs = write_tasks(tmp_path / "tasks", ouro)
    depths = (1, 2, 4, 8)
    args = [
        "harness",
        str(tmp_path / "ouro"),
        "--tasks",
        "tiny_mc,tiny_gen,tiny_ppl",
        "--depths",
        "1,2,4,8",
    ]
    args += ["--include-path", str(tmp_path / "tasks"), "--bootstrap-iters", "0", "--batch-size", "4"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_steps"] == list(depths)
    for depth in depths:
        for task, value in expected_metrics(ouro, docs, depth).items():
            assert report["table"][task][str(depth)] == pytest.approx(value, rel=1e-6), (task, depth)
    assert report["table"]["tiny_ppl"]["1"] != pytest.approx(report["table"]["tiny_ppl"]["8"])


def test_int8_weights_score_and_generate_with_the_quantized_model(model):
    """`harness --weights int8`: the wrapper holds the quantized copy, and its generations are int8 generate's."""
    lm = wrapper(model, batch_size=4, weights="int8")
    assert is_quantized(lm.model) and lm.get_model_info()["weights"] == "int8"
    prompts = ["12+34=", "5+7="]
    got = lm.generate_until(instances("generate_until", [(p, {"max_gen_toks": 5}) for p in prompts]))
    assert got == [greedy_text(model, p, lm.num_steps, 5, weights="int8") for p in prompts]
