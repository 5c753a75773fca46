"""The training loop: exact resume, stopping rules, NaN handling, precision choice, configs, metrics."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time

import pytest
import torch
from torch._dynamo.utils import counters

from latentloop.errors import UsageError
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.nn import Block
from latentloop.tasks import get_task
from latentloop.train import precision as precision_module
from latentloop.train.checkpoint import latest_checkpoint, list_checkpoints
from latentloop.train.loop import train
from latentloop.train.objective import TrainingError
from latentloop.train.precision import choose_precision, resumed_precision
from latentloop.train.recurrence import sampler_for
from latentloop.train.run_config import RunConfig, build_run_config, load_run_config, save_run_config


def _with(config: RunConfig, **train_fields) -> RunConfig:
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **train_fields))


def test_resumed_training_reproduces_the_uninterrupted_losses_exactly(tiny_config, tmp_path):
    straight = train(tiny_config, tmp_path / "straight")
    assert straight.step == 6 and len(straight.losses) == 6

    first = train(tiny_config, tmp_path / "resumed", stop_at=3)
    assert first.step == 3 and first.stopped == "stop_at"
    second = train(tiny_config, tmp_path / "resumed")
    assert second.resumed_from == 3 and second.step == 6
    assert first.losses + second.losses == straight.losses  # bit-for-bit, not approximately

    a = RecurrentDepthLM.from_pretrained(latest_checkpoint(tmp_path / "straight"))
    b = RecurrentDepthLM.from_pretrained(latest_checkpoint(tmp_path / "resumed"))
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    # The metrics log of the resumed run is one continuous record.
    records = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_compiled_training_follows_the_eager_run(tiny_config, tmp_path):
    """``train.compile`` compiles the blocks once, whatever depth each step samples; the losses agree with
    the eager run up to float rounding and the checkpoint loads into a plain model."""
    eager = train(_with(tiny_config, steps=3), tmp_path / "eager")
    counters.clear()
    compiled = train(_with(tiny_config, steps=3, compile=True), tmp_path / "compiled")
    blocks = sum(isinstance(m, Block) for m in RecurrentDepthLM(tiny_config.model).modules())
    # Compiled, and at most once per block: the depth sampled at each step does not cause a recompile.
    assert 0 < counters["stats"]["unique_graphs"] <= blocks
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-3)
    RecurrentDepthLM.from_pretrained(compiled.checkpoint)


def test_compile_without_a_cpp_compiler_is_a_usage_error(tiny_config, tmp_path, monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder

    def missing() -> str:
        raise RuntimeError("no compiler")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    with pytest.raises(UsageError, match="C\\+\\+ compiler"):
        train(_with(tiny_config, compile=True), tmp_path / "run")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_between_steps_and_resumes_exactly(signum, tiny_config, tmp_path, monkeypatch):
    straight = train(tiny_config, tmp_path / "straight")
    original = RecurrentDepthLM.forward
    calls = {"n": 0}

    def interrupting(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.training:  # not the eval-mode twin that counts FLOPs
            calls["n"] += 1
            if calls["n"] == 3:  # Ctrl-C (or a preemption's SIGTERM) arrives in the middle of step 3
                os.kill(os.getpid(), signum)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RecurrentDepthLM, "forward", interrupting)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config, tmp_path / "run")
    assert latest_checkpoint(tmp_path / "run").name == "step_00000003"  # step 3 finished first
    monkeypatch.setattr(RecurrentDepthLM, "forward", original)
    resumed = train(tiny_config, tmp_path / "run")
    assert resumed.losses == straight.losses[3:]


def test_a_finished_run_does_not_train_again(tiny_config, tmp_path):
    train(tiny_config, tmp_path)
    again = train(tiny_config, tmp_path)
    assert again.losses == [] and again.step == 6 and again.resumed_from == 6


def test_each_step_uses_the_sampled_depth(tiny_config, tmp_path, monkeypatch):
    seen = []
    original = RecurrentDepthLM.forward

    def spy(self, input_ids, num_steps=None, **kwargs):
        if torch.is_grad_enabled() and self.training:
            seen.append(num_steps)
        return original(self, input_ids, num_steps=num_steps, **kwargs)

    monkeypatch.setattr(RecurrentDepthLM, "forward", spy)
    config = dataclasses.replace(
        tiny_config, model=dataclasses.replace(tiny_config.model, mean_recurrence=6, mean_backprop_depth=2)
    )
    train(config, tmp_path)
    sampler = sampler_for(config.model, config.train.seed)
    assert seen == [sampler(step) for step in range(6)]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["depth"] for r in records if r["kind"] == "train"] == [sum(sampler(s)) for s in range(6)]


def test_labels_beyond_the_sampled_depth_are_not_scored(tiny_data, tmp_path, monkeypatch):
    seen = []
    original = RecurrentDepthLM.forward

    def spy(self, input_ids, num_steps=None, labels=None, **kwargs):
        if torch.is_grad_enabled() and self.training:
            seen.append((sum(num_steps), labels.clone()))
        return original(self, input_ids, num_steps=num_steps, labels=labels, **kwargs)

    monkeypatch.setattr(RecurrentDepthLM, "forward", spy)
    tiny_data["task"] = {"name": "permutations", "length": "1-12", "prefix_labels": True, "test_size": 32}
    config = build_run_config(tiny_data, ["train.work_per_iteration=1.5"])
    train(config, tmp_path)
    task = get_task("permutations", length="1-12", prefix_labels=True)
    dropped = 0
    for step, (depth, labels) in enumerate(seen):
        inputs, full = task.train_batch(step, config.train.batch_size, config.train.seed)
        reach = task.label_work(inputs) <= 1.5 * depth
        assert depth == sum(sampler_for(config.model, config.train.seed)(step))
        assert torch.equal(labels, torch.where(reach, full, torch.full_like(full, -100)))
        dropped += int(((full != -100) & ~reach).sum())
    assert dropped > 0  # the words of up to 12 letters outgrow depths of about 3


@pytest.mark.parametrize(
    ("task", "overrides", "message"),
    [
        ("permutations", ["train.work_per_iteration=0"], "must be positive"),
        ("permutations", ["train.work_per_iteration=-1"], "must be positive"),
        ("arithmetic", ["train.work_per_iteration=1"], "does not count the work"),
    ],
)
def test_bad_work_per_iteration_is_a_usage_error(tiny_data, tmp_path, task, overrides, message):
    tiny_data["task"] = {"name": task}
    with pytest.raises(UsageError, match=message):
        train(build_run_config(tiny_data, overrides), tmp_path)


def test_loss_falls_on_arithmetic(tiny_config, tmp_path):
    config = _with(tiny_config, steps=30, batch_size=8, warmup_steps=5)
    result = train(config, tmp_path)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.65 * first  # from ln(vocab) ~ 5.6 to the digit-guessing level and below


def test_nan_loss_stops_with_the_step_named(tiny_config, tmp_path, monkeypatch):
    original = RecurrentDepthLM.forward
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if torch.is_grad_enabled() and self.training:  # not the eval-mode twin that counts FLOPs
            calls["n"] += 1
            if calls["n"] == 4:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(RecurrentDepthLM, "forward", poisoned)
    with pytest.raises(TrainingError, match="at step 4"):
        train(_with(tiny_config, checkpoint_every=2), tmp_path)
    assert latest_checkpoint(tmp_path).name == "step_00000002"  # the last good checkpoint survives


def test_budget_stops_early_and_still_checkpoints(tiny_config, tmp_path):
    result = train(_with(tiny_config, steps=10_000, budget_minutes=1e-9), tmp_path)
    assert result.stopped == "budget" and result.step < 10_000
    assert latest_checkpoint(tmp_path) is not None


def test_keep_checkpoints(tiny_config, tmp_path):
    train(_with(tiny_config, checkpoint_every=1, keep_checkpoints=2), tmp_path)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000005", "step_00000006"]


def test_bf16_training_runs(tiny_config, tmp_path):
    result = train(_with(tiny_config, precision="bf16", steps=2), tmp_path)
    assert result.precision == "bf16" and all(torch.isfinite(torch.tensor(result.losses)))


def test_auto_precision_measures_instead_of_guessing(tiny_config, monkeypatch):
    shape = tiny_config.model.n_embd, tiny_config.model.intermediate_size
    monkeypatch.setattr(precision_module, "measure_matmul_speed", lambda *a, **k: {"fp32": 1.0, "bf16": 3.0})
    assert choose_precision("auto", *shape, 512, "cpu") == "fp32"
    monkeypatch.setattr(precision_module, "measure_matmul_speed", lambda *a, **k: {"fp32": 1.0, "bf16": 0.5})
    assert choose_precision("auto", *shape, 512, "cpu") == "bf16"
    assert choose_precision("fp32", *shape, 512, "cpu") == "fp32"
    timing = precision_module.measure_matmul_speed(64, 32, 64, repeats=2)
    assert timing["fp32"] > 0 and timing["bf16"] > 0


def test_text_task_trains(tiny_data, tmp_path):
    config = build_run_config(
        {**tiny_data, "task": {"name": "text", "seq_len": 16}}, ["train.steps=2", "train.eval_size=4"]
    )
    result = train(config, tmp_path)
    assert result.step == 2 and "perplexity" in result.last_eval


def test_run_config_overrides_and_round_trip(tiny_data, tmp_path):
    config = build_run_config(
        tiny_data, ["model.n_embd=64", "train.lr=1e-3", "task.digits=3", "train.betas=[0.8,0.9]"]
    )
    assert config.model.n_embd == 64 and config.train.lr == 1e-3 and config.task.options["digits"] == 3
    assert config.train.betas == (0.8, 0.9)
    path = tmp_path / "config.yaml"
    save_run_config(config, path)
    assert "digits: 3" in path.read_text()  # task options are written flat
    assert load_run_config(path) == config
    assert build_run_config(tiny_data, ["task.ops=-"]).task.options["ops"] == "-"
    assert build_run_config(tiny_data, task="arithmetic:ops=+-").task.options["ops"] == "+-"
    switched = build_run_config(tiny_data, task="text:seq_len=8")
    assert switched.task.name == "text" and switched.task.options == {"seq_len": 8}


@pytest.mark.parametrize(
    "overrides",
    [["model.nope=1"], ["train.lr=abc"], ["task.nope=1"], ["train.precision=fp8"], ["arch=mamba"], ["lr"]],
)
def test_bad_config_values_are_usage_errors(tiny_data, overrides):
    with pytest.raises(UsageError):
        build_run_config(tiny_data, overrides)


def test_resuming_with_another_architecture_is_refused(tiny_config, tmp_path):
    train(_with(tiny_config, steps=1), tmp_path)
    wider = dataclasses.replace(tiny_config, model=dataclasses.replace(tiny_config.model, n_embd=64))
    with pytest.raises(UsageError, match="n_embd"):
        train(wider, tmp_path)


def test_model_must_fit_the_task(tiny_config, tmp_path):
    small_vocab = dataclasses.replace(
        tiny_config, model=dataclasses.replace(tiny_config.model, vocab_size=100)
    )
    with pytest.raises(UsageError, match="vocab_size"):
        train(small_vocab, tmp_path)


def test_auto_precision_resumes_with_the_choice_the_run_started_with():
    # Timing matmuls again on resume could switch a run from fp32 to bf16 half way.
    assert resumed_precision("auto", {"precision": "bf16"}) == "bf16"
    assert resumed_precision("auto", None) == "auto"
    assert resumed_precision("fp32", {"precision": "bf16"}) == "fp32"  # an explicit setting wins


def test_progress_bar_counts_down_the_sooner_of_steps_and_budget():
    from latentloop.train.monitor import ProgressBar

    now = time.perf_counter()
    budget_bound = ProgressBar(False, total=1000, completed=0, budget_s=60.0, started=now - 50.0)
    budget_bound.first_time = now - 1.0  # one step took a second: 999 s by the steps, 10 s by the budget
    assert 9.0 < budget_bound.seconds_left(1) <= 10.0
    steps_bound = ProgressBar(False, total=11, completed=1, started=now)
    steps_bound.first_time = now - 2.0  # two steps since the resume took two seconds: 8 left
    assert 8.0 <= steps_bound.seconds_left(3) < 8.5
    assert steps_bound.seconds_left(1) == math.inf  # no step yet: no estimate


def test_pace_times_the_steps_after_the_first_and_prices_the_rest_of_the_schedule_by_its_flops(monkeypatch):
    from latentloop.train import monitor

    clock = iter([100.0, 104.0, 110.0])
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: next(clock))
    pace = monitor.Pace(first_step=0, skip=10, window=20)
    pace.observe(10, 1e9)  # the first step timed: the 10 before it compile
    assert pace.seconds_left(1e12, 1e9) is None  # nothing timed yet
    pace.observe(20, 5e9)  # 4e9 FLOPs in 4 s
    assert pace.flops_per_s == 1e9 and not pace.ready(20)
    pace.observe(30, 11e9)  # 1e10 FLOPs in 10 s: still 1e9 FLOP/s
    assert pace.ready(30) and not pace.ready(31)
    # A curriculum's deeper steps to come: the schedule's remaining FLOPs, not its remaining steps, set the time.
    assert pace.seconds_left(111e9, 11e9) == 100.0


def test_progress_bar_follows_the_schedules_time_where_pace_measures_it():
    from latentloop.train.monitor import ProgressBar

    bar = ProgressBar(False, total=100, completed=0, started=time.perf_counter())
    bar.first_time = time.perf_counter() - 1.0  # ten steps a second by the average so far: 9 s left
    assert bar.seconds_left(10, schedule_left=250.0) == 250.0
    assert 9.0 <= bar.seconds_left(10) < 9.1


def test_a_run_announces_its_expected_minutes_once_its_first_steps_are_timed(tiny_config, tmp_path):
    announced: list[float] = []
    lines: list[str] = []
    result = train(_with(tiny_config, steps=40), tmp_path, on_pace=announced.append, log=lines.append)
    assert len(announced) == 1 and announced[0] > 0
    assert [line for line in lines if "take about" in line] == [
        f"the 40 steps take about {announced[0] / 60:.1f} min on this machine"
    ]
    assert result.step == 40
    # Too short a schedule to time: no estimate.
    announced.clear()
    train(_with(tiny_config, steps=20), tmp_path / "short", on_pace=announced.append)
    assert announced == []
