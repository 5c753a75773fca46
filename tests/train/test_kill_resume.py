"""Never lose a run: ``latentloop train`` killed with SIGKILL at random moments, and at each phase of writing a
checkpoint, then restarted with the same command, ends with the weights and the loss curve of an
uninterrupted run, bit for bit."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from latentloop.train.checkpoint import latest_checkpoint, list_checkpoints
from latentloop.train.loop import train
from latentloop.train.run_config import build_run_config
from tests.tiny import TINY_LM

STEPS = 10
CONFIG = {
    **TINY_LM,
    "train": {
        **TINY_LM["train"],
        "steps": STEPS,
        "checkpoint_every": 2,
        "keep_checkpoints": 2,
        "eval_every": 0,
        "eval_size": 0,
    },
}

# Runs the command line, but SIGKILLs itself at one phase of the Nth checkpoint write of this process:
# "weights" (optimizer.pt half written into the temporary folder), "rename" (all files written, folder not yet
# renamed), "prune" (new checkpoint in place, older ones not yet pruned); "none" runs normally.
LAUNCH = textwrap.dedent(
    """
    import io, os, signal, sys
    import latentloop.train.checkpoint as checkpoint

    phase, nth, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    calls = {"n": 0}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    real_save, real_replace, real_prune = checkpoint.torch.save, checkpoint.os.replace, checkpoint.prune_checkpoints

    def save(obj, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == nth:
            buffer = io.BytesIO()
            real_save(obj, buffer)
            with open(path, "wb") as stream:
                stream.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            die()
        return real_save(obj, path, *args, **kwargs)

    def replace(src, dst):
        if os.path.basename(str(src)).startswith(".tmp-step_"):
            calls["n"] += 1
            if calls["n"] == nth:
                die()
        return real_replace(src, dst)

    def prune(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == nth:
            die()
        return real_prune(*args, **kwargs)

    if phase == "weights":
        checkpoint.torch.save = save
    elif phase == "rename":
        checkpoint.os.replace = replace
    elif phase == "prune":
        checkpoint.prune_checkpoints = prune

    from latentloop.cli import main
    sys.exit(main(argv))
    """
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Weights and losses of the uninterrupted run, made by the same command in a fresh process (a run inside
    the test process would inherit whatever thread settings earlier tests left behind)."""
    run = Run(tmp_path_factory.mktemp("straight"))
    run.finish()
    weights = load_file(str(latest_checkpoint(run.out) / "model.safetensors"))
    records = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
    return weights, [r["loss"] for r in records if r["kind"] == "train"]


class Run:
    """The same ``latentloop train`` command, started again and again in one run folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "tiny.yaml").write_text(yaml.safe_dump(CONFIG))
        (root / "launch.py").write_text(LAUNCH)
        self.out = root / "run"
        self.argv = ["train", "--config", str(root / "tiny.yaml"), "--out", str(self.out), "-q"]

    def start(self, phase: str = "none", nth: int = 0) -> subprocess.Popen:
        command = [sys.executable, str(self.root / "launch.py"), phase, str(nth), *self.argv]
        return subprocess.Popen(command, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def killed_in_checkpoint(self, phase: str, nth: int) -> None:
        process = self.start(phase, nth)
        process.communicate()
        assert process.returncode == -signal.SIGKILL, process.returncode

    def killed_after(self, step: int, delay_s: float) -> bool:
        """SIGKILL once the run has logged ``step`` (plus ``delay_s``), wherever it then is. Returns whether the
        process was still running just before the kill (a kill after it ended interrupts nothing)."""
        process = self.start()
        while process.poll() is None and self.logged_step() < step:
            time.sleep(0.005)
        time.sleep(delay_s)
        running = process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.communicate()
        return running

    def finish(self) -> None:
        process = self.start()
        _, err = process.communicate()
        assert process.returncode == 0, err.decode()[-2000:]

    def logged_step(self) -> int:
        try:
            lines = (self.out / "metrics.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return 0
        steps = [0]
        for line in lines:
            try:
                steps.append(json.loads(line)["step"])
            except (json.JSONDecodeError, KeyError):
                continue  # a line cut short by the kill
        return max(steps)

    def checkpoint_steps(self) -> list[int]:
        return [int(path.name.split("_")[1]) for path in list_checkpoints(self.out)]

    def temporary_folders(self) -> list[str]:
        return sorted(p.name for p in (self.out / "checkpoints").glob(".tmp-*"))

    def assert_matches(self, reference) -> None:
        weights, losses = reference
        final = latest_checkpoint(self.out)
        assert final is not None and final.name == f"step_{STEPS:08d}"
        saved = load_file(str(final / "model.safetensors"))
        assert saved.keys() == weights.keys()
        for key, value in weights.items():
            assert torch.equal(saved[key], value), key
        records = [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]
        assert [r["loss"] for r in records if r["kind"] == "train"] == losses


def test_killed_in_each_phase_of_a_checkpoint_write(tmp_path, reference):
    run = Run(tmp_path)
    # The second save (step 4) dies with optimizer.pt half written: step 2 stays the last checkpoint.
    run.killed_in_checkpoint("weights", 2)
    assert run.checkpoint_steps() == [2]
    assert run.temporary_folders() and run.temporary_folders()[0].startswith(".tmp-step_00000004-")
    # Resumed from step 2, the save of step 4 dies with every file written but the folder not renamed.
    run.killed_in_checkpoint("rename", 1)
    assert run.checkpoint_steps() == [2]
    # Resumed from step 2, step 4 is saved, step 6 dies after its rename, before older ones are pruned.
    run.killed_in_checkpoint("prune", 2)
    assert run.checkpoint_steps() == [2, 4, 6]
    run.finish()
    assert not run.temporary_folders()  # crashed saves are cleaned up
    assert run.checkpoint_steps() == [8, 10]  # keep_checkpoints=2
    run.assert_matches(reference)


@pytest.mark.parametrize("seed", [7, 11])
def test_killed_at_random_moments(tmp_path, reference, seed):
    """Kills between steps, inside a step, or inside a checkpoint write (every 2nd step)."""
    run = Run(tmp_path)
    chance = random.Random(seed)
    for _ in range(2):
        low = min(run.logged_step() + 1, STEPS - 1)
        step, delay_s = chance.randint(low, STEPS - 1), chance.uniform(0, 0.05)
        assert run.killed_after(step=step, delay_s=delay_s), f"the run had ended before the kill at {step}"
    run.finish()
    assert not run.temporary_folders()
    run.assert_matches(reference)


def test_resuming_never_uses_an_incomplete_checkpoint(tmp_path):
    """A folder with the final name but a missing file (e.g. damaged by hand) is not resumed from."""
    out = tmp_path / "run"
    config = build_run_config({**CONFIG, "train": {**CONFIG["train"], "steps": 4}})
    train(config, out, stop_at=2)
    partial = out / "checkpoints" / "step_00000004"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    result = train(config, out)
    assert result.resumed_from == 2 and result.step == 4
    assert sorted(p.name for p in partial.iterdir()) == sorted(
        ["README.md", "config.json", "model.safetensors", "optimizer.pt", "trainer_state.json"]
    )
    assert not [name for name in os.listdir(out / "checkpoints") if name.startswith((".old-", ".tmp-"))]
