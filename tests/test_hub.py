"""Hub model ids (``org/name``) wherever a model folder is accepted, resolved offline from a Hugging Face cache
filled by hand in huggingface_hub's own layout; model cards; the huginn-0125 layout of saved folders."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import yaml
from safetensors import safe_open

import latentloop.hub
from latentloop.cli import main
from latentloop.errors import UsageError
from latentloop.hub import CARD_FILE, is_repo_id, resolve_model
from latentloop.models.reasoners import ReasonerConfig, build_reasoner, load_reasoner
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.tasks.base import get_task
from tests.conftest import tiny_config

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
IDS = torch.tensor([[5, 17, 3, 42, 8, 1]])
QUEENS = "Q" + "." * 24  # an N-Queens 5x5 board with one given queen


def fill_cache(
    cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)
) -> Path:
    """Store ``folder`` as ``repo_id`` at ``commit`` in huggingface_hub's cache layout: each file's bytes in
    ``blobs/<sha256>``, a relative symlink to it in ``snapshots/<commit>/``, and ``refs/<branch>`` naming the
    commit. Returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache that huggingface_hub uses by default, offline; any socket connection made
    during the test fails it."""
    import huggingface_hub.constants
    import huggingface_hub.utils

    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(folder))
    # A session made before would lack the offline setting (huggingface_hub < 1.0: reset_sessions; later
    # versions: close_session).
    (getattr(huggingface_hub.utils, "reset_sessions", None) or huggingface_hub.utils.close_session)()
    attempts: list[object] = []

    def refuse(sock, address):
        attempts.append(address)
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield folder
    assert attempts == [], f"the test tried to reach the network: {attempts}"


def tiny_lm_folder(folder: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    RecurrentDepthLM(tiny_config(vocab_size=264)).save_pretrained(folder)
    return folder


def tiny_trm_folder(folder: Path, seed: int) -> Path:
    task = get_task("nqueens", n=5)
    torch.manual_seed(seed)
    config = ReasonerConfig(
        vocab_size=task.vocab_size, seq_len=task.seq_len, dim=16, n_heads=2, n_layers=1, hidden=32, n_sup=2
    )
    build_reasoner("trm", config).save_pretrained(folder)
    return folder


def logits(model: RecurrentDepthLM) -> torch.Tensor:
    return model(IDS, num_steps=3, init_scale=0.0).logits


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# Resolution -----------------------------------------------------------------------------------------------
def test_only_namespaced_ids_count_as_hub_ids():
    assert is_repo_id("org/name") and is_repo_id("tomg-group-umd/huginn-0125") and is_repo_id("a_b/c.d")
    for text in (
        "name",
        "/abs/org/name",
        "./org/name",
        "org/name/extra",
        "org//name",
        "org/na--me",
        "org/.x",
    ):
        assert not is_repo_id(text), text


def test_a_hub_id_loads_from_the_offline_cache_with_the_folders_logits(tmp_path, cache):
    folder = tiny_lm_folder(tmp_path / "lm", seed=0)
    snapshot = fill_cache(cache, "org/tiny-lm", folder, COMMIT_A)
    before = files_under(snapshot)
    expected = logits(RecurrentDepthLM.from_pretrained(folder))
    assert torch.equal(logits(RecurrentDepthLM.from_pretrained("org/tiny-lm")), expected)
    assert resolve_model("org/tiny-lm") == snapshot
    # an explicit cache_dir is used instead of the default one
    other = tmp_path / "other-cache"
    fill_cache(other, "org/elsewhere", folder, COMMIT_B)
    with pytest.raises(UsageError, match="org/elsewhere"):
        RecurrentDepthLM.from_pretrained("org/elsewhere")
    loaded = RecurrentDepthLM.from_pretrained("org/elsewhere", cache_dir=other)
    assert torch.equal(logits(loaded), expected)
    assert files_under(snapshot) == before  # loading never writes into the cache


def test_a_reasoner_loads_from_a_hub_id(tmp_path, cache):
    folder = tiny_trm_folder(tmp_path / "trm", seed=0)
    fill_cache(cache, "org/tiny-trm", folder, COMMIT_A)
    local, hub = load_reasoner(folder), load_reasoner("org/tiny-trm")
    batch = {
        "inputs": torch.tensor([get_task("nqueens", n=5).encode(get_task("nqueens", n=5).parse(QUEENS))])
    }
    _, ours = local(local.initial_carry(batch), batch)
    _, theirs = hub(hub.initial_carry(batch), batch)
    assert torch.equal(ours.logits, theirs.logits) and torch.equal(ours.halt_logit, theirs.halt_logit)


def test_a_revision_resolves_through_refs_or_as_a_commit(tmp_path, cache):
    main_folder = tiny_lm_folder(tmp_path / "main", seed=0)
    dev_folder = tiny_lm_folder(tmp_path / "dev", seed=1)
    fill_cache(cache, "org/tiny-lm", main_folder, COMMIT_A, refs=("main",))
    fill_cache(cache, "org/tiny-lm", dev_folder, COMMIT_B, refs=("dev",))
    main_logits = logits(RecurrentDepthLM.from_pretrained(main_folder))
    dev_logits = logits(RecurrentDepthLM.from_pretrained(dev_folder))
    assert not torch.equal(main_logits, dev_logits)
    assert torch.equal(logits(RecurrentDepthLM.from_pretrained("org/tiny-lm")), main_logits)
    assert torch.equal(logits(RecurrentDepthLM.from_pretrained("org/tiny-lm", revision="dev")), dev_logits)
    assert torch.equal(logits(RecurrentDepthLM.from_pretrained("org/tiny-lm", revision=COMMIT_B)), dev_logits)
    with pytest.raises(UsageError, match="not at revision 'v2'"):
        RecurrentDepthLM.from_pretrained("org/tiny-lm", revision="v2")


def test_a_local_folder_wins_over_a_hub_id_of_the_same_spelling(tmp_path, cache, monkeypatch):
    fill_cache(cache, "org/name", tiny_lm_folder(tmp_path / "cached", seed=1), COMMIT_A)
    monkeypatch.chdir(tmp_path)
    local = tiny_lm_folder(tmp_path / "org" / "name", seed=0)
    assert torch.equal(
        logits(RecurrentDepthLM.from_pretrained("org/name")), logits(RecurrentDepthLM.from_pretrained(local))
    )
    with pytest.raises(UsageError, match="local folder"):  # a revision cannot be honoured for a folder
        RecurrentDepthLM.from_pretrained("org/name", revision="main")


def test_a_missing_id_or_cached_file_is_one_line_naming_the_id(tmp_path, cache):
    with pytest.raises(UsageError, match=r"org/absent.*not in the cache.*HF_HUB_OFFLINE"):
        RecurrentDepthLM.from_pretrained("org/absent")
    snapshot = fill_cache(cache, "org/broken", tiny_lm_folder(tmp_path / "lm", seed=0), COMMIT_A)
    (snapshot / "model.safetensors").resolve().unlink()  # the blob is gone, the link stays
    with pytest.raises(UsageError, match=r"org/broken: the cached model.safetensors has lost its data"):
        RecurrentDepthLM.from_pretrained("org/broken")
    with pytest.raises(
        UsageError, match="does not exist"
    ):  # not spelled like an id: an ordinary missing path
        RecurrentDepthLM.from_pretrained(tmp_path / "missing")


# The command line -----------------------------------------------------------------------------------------
def test_generate_eval_and_solve_take_a_hub_id(tmp_path, cache, capsys):
    lm = tiny_lm_folder(tmp_path / "lm", seed=0)
    trm = tiny_trm_folder(tmp_path / "trm", seed=0)
    fill_cache(cache, "org/tiny-lm", lm, COMMIT_A)
    fill_cache(cache, "org/tiny-trm", trm, COMMIT_A, refs=("main", "dev"))
    before = files_under(cache)

    prompt = ["12+34=", "--num-steps", "3", "--max-new-tokens", "4", "--init-scale", "0", "--json"]
    code, out, _ = run_cli(capsys, "generate", str(lm), *prompt)
    assert code == 0
    local = json.loads(out)
    code, out, _ = run_cli(capsys, "generate", "org/tiny-lm", *prompt)
    assert code == 0 and json.loads(out)["tokens"] == local["tokens"]
    code, out, _ = run_cli(capsys, "generate", "org/tiny-lm", *prompt, "--revision", COMMIT_A)
    assert code == 0 and json.loads(out)["tokens"] == local["tokens"]

    evaluation = ["--task", "arithmetic:digits=2", "--depths", "1,3", "--limit", "4", "--json"]
    code, out, _ = run_cli(capsys, "eval", "org/tiny-lm", *evaluation)
    hub_report = json.loads(out)
    code_local, out, _ = run_cli(capsys, "eval", str(lm), *evaluation)
    assert code == code_local == 0 and hub_report["results"] == json.loads(out)["results"]
    assert (
        "written" not in hub_report and (lm / "eval.json").is_file()
    )  # reports go beside local folders only

    solving = ["nqueens:n=5", QUEENS, "--samples", "2", "--json"]
    code_local, out, _ = run_cli(capsys, "solve", *solving, "--model", str(trm))
    code, hub_out, _ = run_cli(capsys, "solve", *solving, "--model", "org/tiny-trm", "--revision", "dev")
    assert code == code_local and code in (0, 1) and json.loads(hub_out) == json.loads(out)
    assert files_under(cache) == before  # nothing was written into the cache


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["generate", "org/absent", "hi"], "org/absent"),
        (["generate", "org/tiny-lm", "hi", "--revision", "nope"], "'nope'"),
        (["eval", "org/absent", "--task", "arithmetic"], "org/absent"),
        (["eval", "org/tiny-lm", "--task", "arithmetic", "--revision", "nope"], "'nope'"),
        (["solve", "nqueens:n=5", QUEENS, "--model", "org/absent"], "org/absent"),
        (["solve", "nqueens:n=5", QUEENS, "--model", "org/tiny-lm", "--revision", "nope"], "'nope'"),
        (["fit-value", "org/tiny-lm"], "org/tiny-lm"),
    ],
)
def test_a_wrong_id_or_revision_is_one_line_and_exit_2(tmp_path, cache, capsys, argv, named):
    fill_cache(cache, "org/tiny-lm", tiny_lm_folder(tmp_path / "lm", seed=0), COMMIT_A)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and named in one_error_line(err)


def test_the_environment_alone_points_a_fresh_process_at_the_offline_cache(tmp_path, capsys):
    """HF_HUB_OFFLINE and HF_HUB_CACHE as a user sets them, read by huggingface_hub when it is imported."""
    cache = tmp_path / "hf-cache"
    lm = tiny_lm_folder(tmp_path / "lm", seed=0)
    fill_cache(cache, "org/tiny-lm", lm, COMMIT_A)
    prompt = ["12+34=", "--num-steps", "2", "--max-new-tokens", "3", "--init-scale", "0", "--json"]
    code, out, _ = run_cli(capsys, "generate", str(lm), *prompt)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    command = [sys.executable, "-m", "latentloop", "generate", "org/tiny-lm", *prompt]
    hub = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert code == hub.returncode == 0, hub.stderr
    assert json.loads(hub.stdout)["tokens"] == json.loads(out)["tokens"]


# Push-ready folders ---------------------------------------------------------------------------------------
def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_saved_folders_carry_a_model_card(tmp_path):
    lm_folder = tiny_lm_folder(tmp_path / "lm", seed=0)
    lm = RecurrentDepthLM.from_pretrained(lm_folder)
    assert files_under(lm_folder) == ["README.md", "config.json", "model.safetensors"]
    card = (lm_folder / CARD_FILE).read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "latentloop" and meta["license"] == "apache-2.0"
    assert {"latentloop", "recurrent-depth"} <= set(meta["tags"])
    assert f"{lm.num_parameters():,}" in card and "| width `n_embd`, heads | 64, 4 |" in card
    assert 'RecurrentDepthLM.from_pretrained("ORG/NAME")' in card

    trm_folder = tiny_trm_folder(tmp_path / "trm", seed=0)
    trm = load_reasoner(trm_folder)
    assert files_under(trm_folder) == ["README.md", "config.json", "model.safetensors"]
    card = (trm_folder / CARD_FILE).read_text()
    assert front_matter(card)["library_name"] == "latentloop" and "trm" in front_matter(card)["tags"]
    assert f"{sum(p.numel() for p in trm.parameters()):,}" in card and 'load_reasoner("ORG/NAME")' in card
    # the trainer's raw weights beside the EMA ones add no second card
    trm.save_pretrained(tmp_path / "raw", weights="train_model.safetensors")
    assert files_under(tmp_path / "raw") == ["config.json", "train_model.safetensors"]


class FakeApi:
    """Stands in for huggingface_hub.HfApi: records what would be uploaded."""

    calls: ClassVar[list[tuple[str, object]]] = []
    uploaded: ClassVar[dict[str, str]] = {}
    fail = False

    def __init__(self, token=None):
        self.calls.append(("token", token))

    def create_repo(self, repo_id, private=None, exist_ok=False):
        self.calls.append(("create_repo", (repo_id, private, exist_ok)))

    def upload_folder(self, repo_id, folder_path, revision=None, commit_message=None):
        if self.fail:
            raise OSError("401 Client Error: Unauthorized\nmore detail")
        folder = Path(folder_path)
        FakeApi.uploaded = {name: (folder / name).read_text(errors="replace") for name in files_under(folder)}
        return f"https://huggingface.co/{repo_id}/commit/{COMMIT_A}"


def test_push_to_hub_uploads_the_saved_folder_with_a_card_naming_the_repo(monkeypatch):
    monkeypatch.setattr(latentloop.hub, "HfApi", FakeApi)
    FakeApi.calls, FakeApi.uploaded, FakeApi.fail = [], {}, False
    torch.manual_seed(0)
    url = RecurrentDepthLM(tiny_config()).push_to_hub("me/tiny", private=True, token="t")
    assert url.endswith(f"/commit/{COMMIT_A}")
    assert sorted(FakeApi.uploaded) == ["README.md", "config.json", "model.safetensors"]
    assert 'from_pretrained("me/tiny")' in FakeApi.uploaded["README.md"]
    assert ("create_repo", ("me/tiny", True, True)) in FakeApi.calls and ("token", "t") in FakeApi.calls
    FakeApi.fail = True
    with pytest.raises(
        UsageError, match=r"^pushing to Hub model me/tiny failed: 401 Client Error: Unauthorized$"
    ):
        RecurrentDepthLM(tiny_config()).push_to_hub("me/tiny")
    with pytest.raises(UsageError, match="not a Hub model id"):
        RecurrentDepthLM(tiny_config()).push_to_hub("no-namespace")


# The huginn-0125 layout -----------------------------------------------------------------------------------
def huginn_0125_layout(c) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a tied huginn-0125 checkpoint of config ``c`` (PAPERS.md A), as the official
    ``RavenForCausalLM`` names its state dict."""
    h, hd, inter = c.n_embd, c.n_embd // c.n_heads, c.intermediate_size
    layout = {
        "transformer.wte.weight": (c.vocab_size, h),
        "transformer.adapter.weight": (h, 2 * h),
        "transformer.ln_f.weight": (h,),
        "freqs_cis": (1, c.block_size, 1, hd // 2, 2),
    }
    stacks = (
        ("prelude", c.n_layers_in_prelude),
        ("core_block", c.n_layers_in_recurrent_block),
        ("coda", c.n_layers_in_coda),
    )
    for part, count in stacks:
        for i in range(count):
            p = f"transformer.{part}.{i}."
            layout.update({p + f"norm_{n}.weight": (h,) for n in range(1, 5)})
            layout[p + "attn.Wqkv.weight"] = (3 * h, h)
            layout[p + "attn.qk_bias"] = (2, 1, c.n_heads, hd)
            layout[p + "attn.proj.weight"] = (h, h)
            layout[p + "mlp.fc.weight"] = (2 * inter, h)
            layout[p + "mlp.proj.weight"] = (h, inter)
    return layout


def test_a_saved_folder_has_the_huginn_0125_keys_shapes_and_config(tmp_path):
    """What the official modeling code needs to load a latentloop folder (a true load into it is
    benchmarks/compare_huginn_reference.py, which needs that code and transformers)."""
    config = tiny_config(n_layers_in_prelude=1, n_layers_in_recurrent_block=2, n_layers_in_coda=2)
    torch.manual_seed(0)
    RecurrentDepthLM(config).save_pretrained(tmp_path / "lm")
    with safe_open(str(tmp_path / "lm" / "model.safetensors"), "pt") as weights:
        saved = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
    assert saved == huginn_0125_layout(config)
    data = json.loads((tmp_path / "lm" / "config.json").read_text())
    expected = {
        "model_type": "huginn_raven",
        "architectures": ["RavenForCausalLM"],
        "n_embd": 64,
        "n_heads": 4,
        "n_layers": 5,
        "n_layers_in_prelude": 1,
        "n_layers_in_recurrent_block": 2,
        "n_layers_in_coda": 2,
        "intermediate_size": 128,
        "vocab_size": 96,
        "block_size": 128,
        "tie_embeddings": True,
        "qk_bias": True,
        "block_class_name": "SandwichBlock",
        "norm_class_name": "RMSNorm_llama",
        "mlp_class_name": "GatedMLP",
        "injection_type": "linear",
        "state_init": "like-init",
    }
    assert {key: data.get(key) for key in expected} == expected
    assert "tie_word_embeddings" not in data  # the official config class sets it itself and refuses a second
