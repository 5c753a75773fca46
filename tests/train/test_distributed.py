"""Data-parallel training: 2 gloo processes under torchrun give the single-process losses of the same global
batch, only rank 0 writes, evaluation is gathered, and a run resumes with a different number of processes.
The same holds for the LM sharded with FSDP (``train.parallel=fsdp``), whose checkpoints keep the
single-process layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.train import distributed as dist
from latentloop.train.deep_supervision import SLOTS_FILE
from latentloop.train.loop import train
from latentloop.train.run_config import build_reasoner_config, build_run_config
from tests.tiny import TINY_LM, TINY_REASONER, tiny_run

TOLERANCE = 1e-5

LM = tiny_run(TINY_LM, train={"eval_every": 2, "eval_batch_size": 4})
REASONER = tiny_run(TINY_REASONER, arch="trm", train={"steps": 3})

# One torchrun job runs every command line of a JSON list (argv lists for latentloop's main). The process
# group is set up once here, so all runs share it (the trainers join an existing group rather than creating
# their own). Each time a sharded model is about to be gathered for a checkpoint, the live sharded model's
# logits on a fixed input are saved as PROBE/logits_<i>.pt, to compare with the model the checkpoint holds.
LAUNCH = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch, torch.distributed
    torch.distributed.init_process_group("gloo")
    from latentloop.cli import main
    from latentloop.train import distributed
    runs, probe = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    inputs, gather, saved = torch.load(probe / "inputs.pt"), distributed.gather_full_state, []

    def probe_then_gather(model, optimizer, ctx):
        with torch.no_grad():
            logits = model(inputs, num_steps=3, init_scale=0.0).logits
        if ctx.is_main:
            torch.save(logits, probe / f"logits_{len(saved)}.pt")
        saved.append(None)
        return gather(model, optimizer, ctx)

    distributed.gather_full_state = probe_then_gather
    codes = [main(argv) for argv in runs]
    torch.distributed.destroy_process_group()
    sys.exit(max(codes))
    """
)
PROBE_INPUTS = (torch.arange(16).reshape(2, 8) * 37) % 264


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def _evals(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "eval"]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """The LM trained uninterrupted in one process (the reference of the multi-process runs)."""
    return train(build_run_config(LM), tmp_path_factory.mktemp("single") / "one")


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """The runs of a 2-process torchrun job: the LM under DDP stopped at step 4 of 6 (``lm``); the reasoner to
    the end (``reasoner``); the LM under FSDP stopped at step 4 (``lm_fsdp``); under FSDP, the rest of a run
    that one process trained to step 2 (``fsdp_from_one``); and the reasoner replacing halted samples, stopped
    at step 2 (``replacing``). ``probe`` holds the FSDP saves' logits."""
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("torchrun is not installed beside this Python")
    root = tmp_path_factory.mktemp("ddp")
    (root / "lm.yaml").write_text(yaml.safe_dump(LM))
    (root / "reasoner.yaml").write_text(yaml.safe_dump(REASONER))
    (root / "launch.py").write_text(LAUNCH)
    (root / "probe").mkdir()
    torch.save(PROBE_INPUTS, root / "probe" / "inputs.pt")
    train(build_run_config(LM), root / "fsdp_from_one", stop_at=2)
    lm, fsdp = ["train", "--config", str(root / "lm.yaml")], "train.parallel=fsdp"
    runs = [
        [*lm, "--out", str(root / "lm"), "--stop-at", "4", "--json", "-q"],
        ["train", "--config", str(root / "reasoner.yaml"), "--out", str(root / "reasoner"), "--json", "-q"],
        [*lm, "--out", str(root / "lm_fsdp"), "--stop-at", "4", "--json", "-q", fsdp],
        [*lm, "--out", str(root / "fsdp_from_one"), "--json", "-q", fsdp],
        [
            *["train", "--config", str(root / "reasoner.yaml"), "--out", str(root / "replacing")],
            *["--stop-at", "2", "--json", "-q", "train.replace_halted=true"],
        ],
    ]
    (root / "runs.json").write_text(json.dumps(runs))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc_per_node=2",
        str(root / "launch.py"),
        str(root / "runs.json"),
        str(root / "probe"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, done.stdout


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(two_process_runs, one_process_run):
    root, stdout = two_process_runs
    one = one_process_run
    two = _losses(root / "lm")
    assert sorted(two) == [1, 2, 3, 4]  # only rank 0 logs: each step once
    for step, loss in two.items():
        assert abs(loss - one.losses[step - 1]) < TOLERANCE, (step, loss, one.losses[step - 1])
    # The held-out evaluation splits its 4 batches over the ranks and sums the counts.
    evals = _evals(root / "lm")
    assert [e["step"] for e in evals] == [2, 4] and all(e["n"] == 16 for e in evals)
    reference = {e["step"]: e["exact_match"] for e in _evals(one.out_dir)}
    assert all(e["exact_match"] == reference[e["step"]] for e in evals)
    # Rank 0 alone printed the results (one JSON line per run) and wrote the checkpoint.
    assert len(stdout.strip().splitlines()) == 5
    assert [p.name for p in (root / "lm" / "checkpoints").iterdir()] == ["step_00000004"]
    state = json.loads((root / "lm" / "checkpoints" / "step_00000004" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 4


@pytest.mark.parametrize("run", ["lm", "lm_fsdp"])
def test_a_two_process_run_resumes_in_one_process(two_process_runs, one_process_run, tmp_path, run):
    root, _ = two_process_runs
    out = tmp_path / "resumed"
    shutil.copytree(root / run, out)
    resumed = train(build_run_config(LM), out)
    assert resumed.resumed_from == 4 and resumed.step == 6
    for got, want in zip(resumed.losses, one_process_run.losses[4:], strict=True):
        assert abs(got - want) < TOLERANCE


def test_fsdp_over_two_gloo_processes_matches_one_process(two_process_runs, one_process_run):
    root, _ = two_process_runs
    two = _losses(root / "lm_fsdp")
    assert sorted(two) == [1, 2, 3, 4]
    for step, loss in two.items():
        assert abs(loss - one_process_run.losses[step - 1]) < TOLERANCE, (step, loss)
    # Every rank evaluates all batches of the sharded model (its forwards are collectives).
    evals = _evals(root / "lm_fsdp")
    reference = {e["step"]: e["exact_match"] for e in _evals(one_process_run.out_dir)}
    assert [e["step"] for e in evals] == [2, 4] and all(e["n"] == 16 for e in evals)
    assert all(e["exact_match"] == reference[e["step"]] for e in evals)
    checkpoint = root / "lm_fsdp" / "checkpoints" / "step_00000004"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["parallel"] == "fsdp"
    # The same single-file layout as a one-process checkpoint: the full weights and optimizer state.
    reference_checkpoint = one_process_run.checkpoint
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted(
        p.name for p in reference_checkpoint.iterdir()
    )
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)["optimizer"]
    want = torch.load(reference_checkpoint / "optimizer.pt", weights_only=True)["optimizer"]
    assert saved["state"].keys() == want["state"].keys()
    for index, moments in saved["state"].items():
        assert moments["exp_avg"].shape == want["state"][index]["exp_avg"].shape


def test_an_fsdp_checkpoint_holds_the_trained_model(two_process_runs):
    root, _ = two_process_runs
    for i, run, step in ((0, "lm_fsdp", 4), (1, "fsdp_from_one", 6)):
        model = RecurrentDepthLM.from_pretrained(root / run / "checkpoints" / f"step_{step:08d}")
        with torch.no_grad():
            logits = model(PROBE_INPUTS, num_steps=3, init_scale=0.0).logits
        trained = torch.load(root / "probe" / f"logits_{i}.pt", weights_only=True)
        assert (logits - trained).abs().max() < TOLERANCE, run


def test_a_one_process_run_resumes_under_fsdp(two_process_runs, one_process_run):
    root, _ = two_process_runs
    losses = _losses(root / "fsdp_from_one")
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]  # steps 1-2 from one process, 3-6 from two under FSDP
    for step, loss in losses.items():
        assert abs(loss - one_process_run.losses[step - 1]) < TOLERANCE, (step, loss)
    state = json.loads(
        (root / "fsdp_from_one" / "checkpoints" / "step_00000006" / "trainer_state.json").read_text()
    )
    assert state["parallel"] == "fsdp"


def test_train_parallel_is_checked_and_fsdp_in_one_process_is_plain_training(one_process_run, tmp_path):
    with pytest.raises(UsageError, match=r"train\.parallel must be one of ddp, fsdp, got 'zero'"):
        build_run_config(LM, ["train.parallel=zero"])
    with pytest.raises(UsageError, match="reasoners train with ddp"):
        build_reasoner_config(REASONER, ["train.parallel=fsdp"])
    alone = train(build_run_config(LM, ["train.parallel=fsdp"]), tmp_path / "alone", stop_at=2)
    assert alone.losses == one_process_run.losses[:2]


def test_deep_supervision_ranks_stay_in_step(two_process_runs, tmp_path):
    root, _ = two_process_runs
    one = train(build_reasoner_config(REASONER), tmp_path / "one")
    two = _losses(root / "reasoner")
    assert sorted(two) == [1, 2, 3]
    # Logged per batch: the mean of its n_sup supervision losses.
    for step, loss in two.items():
        want = sum(one.losses[(step - 1) * 2 : step * 2]) / 2
        assert abs(loss - want) < TOLERANCE, (step, loss, want)
    assert _evals(root / "reasoner")[-1]["step"] == 3


def test_replacing_halted_samples_saves_every_ranks_slots_and_resumes_in_one_process(
    two_process_runs, tmp_path
):
    root, _ = two_process_runs
    checkpoint = root / "replacing" / "checkpoints" / "step_00000002"
    slots = load_file(str(checkpoint / SLOTS_FILE))
    assert slots["0.inputs"].shape == slots["1.inputs"].shape == (4, 25)  # half of batch 8 each
    assert not torch.equal(slots["0.inputs"], slots["1.inputs"]), "each rank draws its own samples"
    run = tmp_path / "replacing"
    shutil.copytree(root / "replacing", run)
    lines: list[str] = []
    config = build_reasoner_config(REASONER, ["train.replace_halted=true"])
    resumed = train(config, run, log=lines.append)
    assert resumed.resumed_from == 2 and resumed.step == 3
    assert any("start with fresh samples" in line for line in lines)


def test_shards_partition_the_batch_without_overlap():
    rows = torch.arange(10)
    for world in (1, 2, 3, 4):
        parts = [dist.shard(rows, dist.DistContext(rank, world)) for rank in range(world)]
        assert torch.equal(torch.cat(parts), rows)
        assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_a_batch_that_does_not_split_evenly_is_a_usage_error():
    dist.check_batch(8, dist.DistContext(0, 2))
    with pytest.raises(UsageError, match="does not split evenly over 3 processes"):
        dist.check_batch(8, dist.DistContext(0, 3))


def test_single_process_without_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    ctx, device = dist.setup("cpu")
    assert ctx == dist.SINGLE and device == "cpu" and ctx.is_main and not ctx.enabled
    assert dist.all_reduce_sum([1.5, 2.0], ctx) == [1.5, 2.0]
    assert dist.any_rank([True, False], ctx) == [True, False]
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="launch multi-process runs with torchrun"):
        dist.setup("cpu")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(UsageError, match="WORLD_SIZE must be an integer"):
        dist.setup("cpu")


@pytest.mark.parametrize("trainer", ["lm", "reasoner"])
def test_a_process_group_the_trainer_created_is_gone_when_it_returns(trainer, tmp_path, monkeypatch):
    """What torchrun's launch does in ``setup``, done here by a one-process gloo group over a file store."""

    def setup(device):
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )
        return dist.DistContext(0, 1, 0, "gloo", owns_group=True), device

    monkeypatch.setattr(dist, "setup", setup)
    if trainer == "lm":
        train(build_run_config(LM, ["train.steps=1"]), tmp_path / "lm")
    else:
        train(build_reasoner_config(REASONER, ["train.steps=1"]), tmp_path / "reasoner")
    assert not torch.distributed.is_initialized()
