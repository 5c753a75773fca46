"""Data-parallel training: 2 gloo processes under torchrun give the single-process losses of the same global
batch, only rank 0 writes, evaluation is gathered, and a run resumes with a different number of processes."""

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

from latentloop.errors import UsageError
from latentloop.train import distributed as dist
from latentloop.train.deep_supervision import build_reasoner_config, train_reasoner
from latentloop.train.trainer import build_run_config, train
from tests.train.conftest import TINY

TOLERANCE = 1e-5

LM = {
    **TINY,
    "train": {**TINY["train"], "steps": 6, "eval_every": 2, "eval_size": 16, "eval_batch_size": 4},
}
REASONER = {
    "arch": "trm",
    "model": {"dim": 16, "n_heads": 2, "n_layers": 1, "hidden": 32, "n_sup": 2, "cycles": 2, "inner": 2},
    "train": {
        "lr": 3e-3,
        "warmup_steps": 2,
        "batch_size": 8,
        "steps": 3,
        "precision": "fp32",
        "device": "cpu",
        "log_every": 1,
        "eval_size": 4,
        "checkpoint_every": 0,
        "tensorboard": False,
    },
    "task": {"name": "nqueens", "n": 5},
}

# One torchrun job trains both model families through the command line. The process group is set up once
# here, so both runs share it (the trainers join an existing group rather than creating their own).
LAUNCH = textwrap.dedent(
    """
    import sys
    import torch.distributed
    torch.distributed.init_process_group("gloo")
    from latentloop.cli import main
    lm, reasoner, lm_out, reasoner_out = sys.argv[1:5]
    codes = [
        main(["train", "--config", lm, "--out", lm_out, "--stop-at", "4", "--json", "-q"]),
        main(["train", "--config", reasoner, "--out", reasoner_out, "--json", "-q"]),
    ]
    torch.distributed.destroy_process_group()
    sys.exit(max(codes))
    """
)


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def _evals(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "eval"]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """The runs of a 2-process torchrun job (LM stopped at step 4 of 6; reasoner to the end)."""
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("torchrun is not installed beside this Python")
    root = tmp_path_factory.mktemp("ddp")
    (root / "lm.yaml").write_text(yaml.safe_dump(LM))
    (root / "reasoner.yaml").write_text(yaml.safe_dump(REASONER))
    (root / "launch.py").write_text(LAUNCH)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc_per_node=2",
        str(root / "launch.py"),
        *(str(root / name) for name in ("lm.yaml", "reasoner.yaml", "lm", "reasoner")),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, done.stdout


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(two_process_runs, tmp_path):
    root, stdout = two_process_runs
    one = train(build_run_config(LM), tmp_path / "one")
    two = _losses(root / "lm")
    assert sorted(two) == [1, 2, 3, 4]  # only rank 0 logs: each step once
    for step, loss in two.items():
        assert abs(loss - one.losses[step - 1]) < TOLERANCE, (step, loss, one.losses[step - 1])
    # The held-out evaluation splits its 4 batches over the ranks and sums the counts.
    evals = _evals(root / "lm")
    assert [e["step"] for e in evals] == [2, 4] and all(e["n"] == 16 for e in evals)
    reference = {e["step"]: e["exact_match"] for e in _evals(tmp_path / "one")}
    assert all(e["exact_match"] == reference[e["step"]] for e in evals)
    # Rank 0 alone printed the results (one JSON line per run) and wrote the checkpoint.
    assert len(stdout.strip().splitlines()) == 2
    assert [p.name for p in (root / "lm" / "checkpoints").iterdir()] == ["step_00000004"]
    state = json.loads((root / "lm" / "checkpoints" / "step_00000004" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 4


def test_a_two_process_run_resumes_in_one_process(two_process_runs, tmp_path):
    root, _ = two_process_runs
    out = tmp_path / "resumed"
    shutil.copytree(root / "lm", out)
    resumed = train(build_run_config(LM), out)
    one = train(build_run_config(LM), tmp_path / "one")
    assert resumed.resumed_from == 4 and resumed.step == 6
    for got, want in zip(resumed.losses, one.losses[4:], strict=True):
        assert abs(got - want) < TOLERANCE


def test_deep_supervision_ranks_stay_in_step(two_process_runs, tmp_path):
    root, _ = two_process_runs
    one = train_reasoner(build_reasoner_config(REASONER), tmp_path / "one")
    two = _losses(root / "reasoner")
    assert sorted(two) == [1, 2, 3]
    # Logged per batch: the mean of its n_sup supervision losses.
    for step, loss in two.items():
        want = sum(one.losses[(step - 1) * 2 : step * 2]) / 2
        assert abs(loss - want) < TOLERANCE, (step, loss, want)
    assert _evals(root / "reasoner")[-1]["step"] == 3


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
