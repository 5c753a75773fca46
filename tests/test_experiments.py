"""Experiments: train every model on its fixed schedule, evaluate alike, report; resume skips finished parts."""

from __future__ import annotations

import json

import pytest
import yaml

from latentloop.cli import main
from latentloop.config import load_yaml
from latentloop.errors import UsageError
from latentloop.experiments import aggregation, available_experiments, load_experiment
from latentloop.experiments.kinds import get_kind
from latentloop.experiments.report import format_flops, report_markdown, schedule_sentence
from latentloop.experiments.runner import run_experiment
from latentloop.experiments.training import check_run_configs, pace_line, planned_steps
from latentloop.paths import CONFIGS_DIR
from latentloop.tasks import get_task
from latentloop.train.run_config import build_reasoner_config, build_run_config
from tests.tiny import TINY_LM, TINY_REASONER, tiny_run

TINY_MODEL = TINY_REASONER["model"]
TINY_TRAIN = {**TINY_REASONER["train"], "steps": 3, "eval_size": 0}


def write_experiment(folder, **changes):
    for arch in ("gram", "trm"):
        run = {"arch": arch, "model": TINY_MODEL, "train": TINY_TRAIN, "task": {"name": "nqueens", "n": 5}}
        (folder / f"{arch}.yaml").write_text(yaml.safe_dump(run))
    spec = {
        "description": "tiny",
        "models": {"gram": {"config": "gram.yaml"}, "trm": {"config": "trm.yaml"}},
        "eval": {"samples": 3, "steps": 2, "limit": 4},
        "paper": {"gram": {"accuracy": 99.7, "coverage": 90.3}},
        **changes,
    }
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_experiment_trains_evaluates_and_reports(tmp_path):
    experiment = load_experiment(str(write_experiment(tmp_path)))
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    assert set(results["models"]) == {"gram", "trm"}
    for name, row in results["models"].items():
        assert row["train"]["step"] == 3 and row["train"]["stopped"] == "steps"
        assert row["eval"]["samples"] == 3 and len(row["eval"]["curve_steps"]) == 2
        assert (tmp_path / "out" / name / "eval.json").is_file()
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["models"]["gram"]["eval"]["accuracy"] == results["models"]["gram"]["eval"]["accuracy"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| gram |" in report and "| trm |" in report and "99.7" in report
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0
    # A few answers of each model are kept (tokens, the verifier's verdict) and drawn.
    for row in results["models"].values():
        examples = row["eval"]["examples"]
        assert 1 <= len(examples) <= 4 and all(len(e["answer"]) == 25 for e in examples)
    assert (tmp_path / "out" / "boards.png").stat().st_size > 0 and "boards.png" in report
    # The table gives each model's training compute: the FLOPs its run counted, as its metrics log says.
    for name, row in results["models"].items():
        logged = [json.loads(line) for line in (tmp_path / "out" / name / "metrics.jsonl").open()]
        flops = max(r["flops"] for r in logged if "flops" in r)
        assert row["train"]["flops"] == flops > 0
        assert f"| {name} | {row['train']['parameters']:,} | " in report
        assert f" / {row['train']['step']} / {format_flops(flops)} |" in report
    # N-Queens has many solutions: beside coverage, the share of puzzles one of whose samples is valid.
    assert "| any sample valid | coverage |" in report
    for row in results["models"].values():
        ev = row["eval"]
        assert f" {100 * ev['oracle_accuracy']:.1f} | {100 * ev['coverage']:.1f} |" in report


def test_a_rerun_that_measures_nothing_keeps_the_machine_that_measured(tmp_path, monkeypatch):
    path, out = str(write_experiment(tmp_path)), tmp_path / "out"
    first = run_experiment(load_experiment(path), out, progress=False, log=lambda _: None)
    elsewhere = {**aggregation.machine(), "cpu": "another machine"}
    monkeypatch.setattr(aggregation, "machine", lambda: elsewhere)
    # Every model trained and evaluated already: the report is rendered again, its numbers still this machine's.
    side_by_side = load_experiment(path)
    side_by_side.jobs = 2
    again = run_experiment(side_by_side, out, progress=False, log=lambda _: None)
    assert again["machine"] == first["machine"] != elsewhere
    assert again["jobs"] == first["jobs"] == 1  # how the models were trained, not how this run would
    assert json.loads((out / "results.json").read_text())["machine"] == first["machine"]
    assert "another machine" not in (out / "report.md").read_text()
    # A model evaluated anew was measured here: the results name this machine.
    (out / "gram" / "eval.json").unlink()
    third = run_experiment(load_experiment(path), out, progress=False, log=lambda _: None)
    assert third["machine"] == elsewhere
    assert "another machine" in (out / "report.md").read_text()


def test_a_table_assembled_in_parts_names_where_and_when_each_model_trained(tmp_path):
    path, out = str(write_experiment(tmp_path)), tmp_path / "out"
    first = run_experiment(load_experiment(path), out, progress=False, log=lambda _: None)
    for row in first["models"].values():
        assert row["train"]["date"] == first["date"] and row["train"]["cpu"] == first["machine"]["cpu"]
    assert "Trained in parts" not in (out / "report.md").read_text()
    # trm's folder comes from another sitting; gram is evaluated again here.
    trm = json.loads((out / "trm" / "train.json").read_text())
    (out / "trm" / "train.json").write_text(json.dumps({**trm, "date": "2026-01-01", "cpu": "another CPU"}))
    (out / "gram" / "eval.json").unlink()
    run_experiment(load_experiment(path), out, progress=False, log=lambda _: None)
    here = f"{first['date']} ({first['machine']['cpu'] or 'CPU not recorded'})"
    assert (
        f"Trained in parts: gram on {here}; trm on 2026-01-01 (another CPU)."
        in (out / "report.md").read_text()
    )
    # A record written before records named their date and CPU is not taken for this run's.
    del trm["date"], trm["cpu"]
    (out / "trm" / "train.json").write_text(json.dumps(trm))
    (out / "gram" / "eval.json").unlink()
    run_experiment(load_experiment(path), out, progress=False, log=lambda _: None)
    assert (
        f"Trained in parts: gram on {here}; trm in an earlier run (date and CPU not recorded)."
        in (out / "report.md").read_text()
    )


def test_results_name_their_files_relative_to_the_output_folder_and_the_experiment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_experiment(tmp_path)
    out = tmp_path / "out"  # absolute, and still nothing absolute is written
    results = run_experiment(
        load_experiment(str(path), ["eval.fit_value=1"]), out, progress=False, log=lambda _: None
    )
    assert results["file"] == "tiny.yaml"  # relative to the working directory
    for name, row in results["models"].items():
        assert row["train"]["config"] == f"{name}.yaml"  # as the experiment file names it
        evaluation = row["eval"]
        assert evaluation["run"] == name and evaluation["checkpoint"].startswith(f"{name}/checkpoints/step_")
        assert evaluation["written"] and all(p.startswith(f"{name}/") for p in evaluation["written"])
        assert all(
            (out / p).is_file() for p in [*evaluation["written"], evaluation["checkpoint"] + "/config.json"]
        )
    assert results["models"]["gram"]["eval"]["value_fit"]["file"].startswith("gram/checkpoints/")
    saved = (out / "results.json").read_text() + (out / "gram" / "eval.json").read_text()
    saved += (out / "gram" / "train.json").read_text() + (out / "report.md").read_text()
    assert str(tmp_path) not in saved
    # A rerun reads the stored files back as they are.
    again = run_experiment(
        load_experiment(str(path), ["eval.fit_value=1"]), out, progress=False, log=lambda _: None
    )
    assert again["models"] == results["models"]
    # So do a model's results copied into another folder without its checkpoints, read from elsewhere.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("gram", "trm"):
        (copy / name).mkdir()
        for file in ("config.yaml", "train.json", "eval.json"):
            (copy / name / file).write_text((out / name / file).read_text())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    copied = run_experiment(
        load_experiment(str(path), ["eval.fit_value=1"]), copy, progress=False, log=lambda _: None
    )
    assert copied["models"] == results["models"]


def test_a_shipped_experiment_is_named_by_its_path_in_the_package():
    from latentloop.paths import shipped_or_relative

    experiment = load_experiment("default")
    assert shipped_or_relative(experiment.path) == "configs/experiments/default.yaml"
    assert shipped_or_relative(experiment.models[0].config) == "configs/graph-coloring8-gram-fast.yaml"


def test_second_run_skips_finished_parts(tmp_path):
    experiment = load_experiment(str(write_experiment(tmp_path)))
    run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*/eval.json")}
    lines: list[str] = []
    run_experiment(experiment, tmp_path / "out", progress=False, log=lines.append)
    assert sum("skipping" in line for line in lines) == 4  # two models, train and eval each
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


def test_interrupted_model_resumes_from_its_checkpoint(tmp_path):
    from latentloop.train.loop import train

    experiment = load_experiment(str(write_experiment(tmp_path)))
    gram = experiment.models[0]
    config = build_reasoner_config(yaml.safe_load(gram.config.read_text()))
    train(config, tmp_path / "out" / "gram", stop_at=2)  # as if killed after two batches
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    metrics = [json.loads(x) for x in (tmp_path / "out" / "gram" / "metrics.jsonl").read_text().splitlines()]
    assert results["models"]["gram"]["train"]["step"] == 3
    assert [m["step"] for m in metrics if m["kind"] == "train"] == [1, 2, 3]  # batch 3 only was added


def test_a_model_trained_to_its_end_before_the_run_keeps_its_final_loss(tmp_path):
    from latentloop.train.loop import train

    experiment = load_experiment(str(write_experiment(tmp_path)))
    gram = experiment.models[0]
    config = build_reasoner_config(yaml.safe_load(gram.config.read_text()))
    train(config, tmp_path / "out" / "gram")  # the whole schedule, outside the experiment
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    metrics = [json.loads(x) for x in (tmp_path / "out" / "gram" / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if m["kind"] == "train"][-1]
    assert last["step"] == results["models"]["gram"]["train"]["step"] == 3
    assert results["models"]["gram"]["train"]["final_loss"] == last["loss"]


def test_budget_is_split_between_models(tmp_path):
    experiment = load_experiment(str(write_experiment(tmp_path)))
    results = run_experiment(
        experiment, tmp_path / "out", budget_minutes=3, progress=False, log=lambda _: None
    )
    assert results["budget_minutes_per_model"] == 1.5
    assert results["models"]["trm"]["train"]["budget_minutes"] == 1.5
    # A cap the models finish within leaves their schedules whole: the report is the reference result.
    assert not results["models"]["trm"]["train"]["time_capped"]
    assert "fixed schedules, the same on any machine: gram 3, trm 3 steps" in report_markdown(results)


def test_without_a_cap_every_model_trains_its_whole_schedule_and_the_report_names_it(tmp_path):
    experiment = load_experiment(str(write_experiment(tmp_path)))
    assert experiment.budget_minutes is None
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    assert results["budget_minutes_per_model"] is None
    for row in results["models"].values():
        assert (row["train"]["planned_steps"], row["train"]["step"], row["train"]["time_capped"]) == (
            3,
            3,
            False,
        )
    heading = (tmp_path / "out" / "report.md").read_text().split("\n")[4]
    assert "fixed schedules, the same on any machine: gram 3, trm 3 steps" in heading
    assert "budget" not in heading


def test_a_report_made_under_a_time_cap_says_so_and_how_many_steps_ran(tmp_path):
    experiment = load_experiment(str(write_experiment(tmp_path)))
    results = run_experiment(
        experiment, tmp_path / "out", budget_minutes=0.0002, progress=False, log=lambda _: None
    )
    for row in results["models"].values():
        assert row["train"]["time_capped"] and row["train"]["step"] < row["train"]["planned_steps"] == 3
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        "time-capped at 0.0001 min per model: gram 0 of 3 planned steps, trm 0 of 3 planned steps" in report
    )
    assert "not the reference result" in report


def test_a_schedule_fitted_to_a_time_cap_is_reported_as_time_capped(tmp_path, monkeypatch):
    from latentloop.train import loop

    monkeypatch.setattr(loop, "FIT_SHARE", 0.0)  # fit after timing steps 10 to 15
    monkeypatch.setattr(loop, "FIT_MIN_STEPS", 5)
    experiment = load_experiment(
        str(write_experiment(tmp_path)), ["train.steps=100000", "train.fit_steps=true"]
    )
    results = run_experiment(
        experiment, tmp_path / "out", budget_minutes=0.2, progress=False, log=lambda _: None
    )
    for row in results["models"].values():
        assert row["train"]["time_capped"] and row["train"]["step"] < row["train"]["planned_steps"] == 100000
    assert "time-capped at 0.1 min per model" in (tmp_path / "out" / "report.md").read_text()


def _results_with(trained: dict, minutes=None) -> dict:
    return {"budget_minutes_per_model": minutes, "models": {n: {"train": t} for n, t in trained.items()}}


def test_the_schedule_sentence_of_fixed_capped_and_time_budgeted_results():
    fixed = {"planned_steps": 6000, "step": 6000, "time_capped": False}
    capped = {"planned_steps": 3300, "step": 1200, "time_capped": True}
    assert (
        schedule_sentence(
            _results_with({"gram": fixed, "trm": {**capped, "step": 3300, "time_capped": False}})
        )
        == "fixed schedules, the same on any machine: gram 6,000, trm 3,300 steps"
    )
    assert schedule_sentence(_results_with({"gram": fixed, "trm": capped}, 10.5)) == (
        "time-capped at 10.5 min per model: trm 1,200 of 3,300 planned steps "
        "(not the reference result; planned: gram 6,000, trm 3,300 steps)"
    )
    # Results written when experiments trained for minutes record no planned schedule.
    assert schedule_sentence(_results_with({"gram": {"step": 5244}}, 21.0)) == (
        "training budget 21 min of wall-clock per model (a schedule fitted to the minutes)"
    )


def test_the_pace_line_compares_this_machine_with_the_reference_machine():
    assert pace_line("gram", 1800.0, None, 25.0) == "gram: training takes about 30 min on this machine"
    assert pace_line("gram", 1800.0, 15.0, 25.0) == (
        "gram: training takes about 30 min on this machine, 15 on the reference machine (0.50x its speed); "
        "the whole experiment about 50 min here (25 there)"
    )
    assert pace_line("lm", 600.0, 20.0, None) == (
        "lm: training takes about 10 min on this machine, 20 on the reference machine (2.00x its speed)"
    )


# The schedule every shipped experiment trains, in steps (batches) per model. Pinned so that no experiment's
# numbers depend on the speed of the machine again: a change of recipe changes this table on purpose.
SHIPPED_SCHEDULES = {
    "arc-agi-1": {"trm": 27, "gram": 49},
    "default": {"gram": 5000, "trm": 2750},
    "digits": {"gram": 790, "gram-seed-1": 790, "mdlm": 9356},
    "graph-coloring10": {"gram": 7266, "gram-seed-1": 7266, "trm": 3230, "ar": 15300, "mdlm": 32450},
    "graph-coloring8": {
        "direct": 2000,
        "looped": 600,
        "hrm": 525,
        "trm": 125,
        "ar": 2000,
        "mdlm": 2000,
        "gram": 220,
    },
    "graph-coloring8-fast": {"gram": 5000, "trm": 2750, "direct": 52400, "looped": 9760, "hrm": 10270},
    "lm-depth": {"core2-depth16": 8000},
    "maze": {"direct": 1600, "trm": 360},
    "nqueens10": {"gram": 2920, "gram-seed-1": 2920, "trm": 1700, "ar": 7170, "mdlm": 18140},
    "nqueens8": {"direct": 2000, "looped": 345, "hrm": 305, "trm": 70, "ar": 1900, "mdlm": 2000, "gram": 120},
    "nqueens8-fast": {
        "gram": 7050,
        "trm": 4400,
        "ar": 10500,
        "mdlm": 45000,
        "direct": 48400,
        "looped": 7600,
        "hrm": 7270,
    },
    "nqueens8-ablation": dict.fromkeys(["full", "no-guidance", "stochasticity-only"], 7100),
    "nqueens8-gram-fast": {"seed-0": 7100, "seed-1": 7100},
    "nqueens8-long": dict.fromkeys(["gram", "trm", "hrm", "looped", "direct", "ar", "mdlm"], 15400),
    "nqueens8-time": {
        "long-recipe": 1960,
        "schedule": 1900,
        "n_sup-4": 3800,
        "curriculum": 3800,
        "step-weights": 3800,
        "fast-recipe": 9500,
    },
    "sudoku-scaling": {"trm": 230, "gram": 330},
    "sudoku9": {
        "trm-seed-0": 3300,
        "gram-seed-0": 3175,
        "trm-seed-1": 3300,
        "gram-seed-1": 3175,
        "gram-hybrid-seed-0": 3175,
        "gram-hybrid-seed-1": 3175,
    },
    "sudoku9-ablation": dict.fromkeys(["full", "no-guidance", "stochasticity-only"], 5350),
    "sudoku-time": {
        "paper-recursion": 125,
        "replace-halted": 120,
        "curriculum": 825,
        "step-weights": 815,
        "schedule": 230,
    },
    "sudoku-unconditional": {
        "gram-seed-0": 1350,
        "gram-seed-1": 1350,
        "mdlm": 15961,
        "gram-9x9": 1350,
        "gram-9x9-seed-1": 1350,
    },
}


def test_every_shipped_experiment_trains_a_fixed_schedule_whatever_the_machine():
    assert set(available_experiments()) == set(SHIPPED_SCHEDULES)
    for name, schedule in SHIPPED_SCHEDULES.items():
        experiment = load_experiment(name)
        assert experiment.budget_minutes is None, name
        assert planned_steps(experiment) == schedule, name
        runs = get_kind(experiment.kind).runs
        for spec in experiment.models:
            train = runs.config(spec).train
            assert train.budget_minutes is None and not train.fit_steps, (name, spec.name)


def test_every_shipped_config_fixes_its_precision():
    """``precision: auto`` times a matmul in fp32 and bf16 and keeps the faster, so a busy or a slower machine
    could train another rounding; every shipped config names one instead."""
    configs = sorted(CONFIGS_DIR.glob("*.yaml"))
    assert configs
    for path in configs:
        assert load_yaml(path)["train"].get("precision") in ("fp32", "bf16"), path.name


def test_a_worker_is_sent_sigterm_once_the_run_that_started_it_is_killed(tmp_path):
    """The worker's parent exits at once (as a killed ``latentloop run`` would); the adopted worker gets the
    SIGTERM its training turns into a checkpoint and a stop."""
    import subprocess
    import sys
    import time

    stopped = tmp_path / "stopped"
    worker = (
        "import signal, sys, time\n"
        "from latentloop.experiments.workers import stop_when_orphaned\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(stopped)!r}, 'w').close(), sys.exit(0)))\n"
        "stop_when_orphaned(int(sys.argv[1]), poll_s=0.05)\n"
        "time.sleep(120)\n"
    )
    parent = (
        f"import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', {worker!r}, str(os.getpid())])"
    )
    subprocess.run([sys.executable, "-c", parent], check=True)
    for _ in range(1200):  # the worker imports torch first
        if stopped.exists():
            break
        time.sleep(0.1)
    assert stopped.exists()


def test_pinned_threads_per_model_give_the_same_numbers_side_by_side_and_one_at_a_time(tmp_path, monkeypatch):
    import torch

    experiment = load_experiment(str(write_experiment(tmp_path, jobs=2, threads_per_model=1)))
    assert (experiment.jobs, experiment.threads_per_model) == (2, 1)
    side_by_side = run_experiment(experiment, tmp_path / "both", progress=False, log=lambda _: None)
    assert side_by_side["jobs"] == 2 and side_by_side["threads_per_model"] == 1
    monkeypatch.setattr(experiment, "jobs", 1)
    before = torch.get_num_threads()
    alone = run_experiment(experiment, tmp_path / "alone", progress=False, log=lambda _: None)
    assert torch.get_num_threads() == before  # the process's own count comes back
    assert alone["jobs"] == 1 and alone["threads_per_model"] == 1
    for name in ("gram", "trm"):
        ours, theirs = side_by_side["models"][name], alone["models"][name]
        assert ours["train"]["torch_threads"] == theirs["train"]["torch_threads"] == 1
        assert ours["train"]["final_loss"] == theirs["train"]["final_loss"]
        assert ours["eval"]["curve_samples"] == theirs["eval"]["curve_samples"]
    report = (tmp_path / "both" / "report.md").read_text()
    assert "2 models at a time, 1 thread each" in report


def test_without_pinned_threads_each_model_gets_an_equal_share(tmp_path):
    import torch

    experiment = load_experiment(str(write_experiment(tmp_path, jobs=2)))
    assert experiment.threads_per_model is None
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    assert results["threads_per_model"] == max(1, torch.get_num_threads() // 2)


def test_every_shipped_experiment_pins_the_threads_of_the_reference_machine():
    # The reference machine has 2 cores: models side by side get one each, a model alone gets both.
    for name in available_experiments():
        experiment = load_experiment(name)
        assert experiment.threads_per_model == (1 if experiment.jobs > 1 else 2), name


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"models": {}}, "'models'"),
        ({"models": {"gram": {"config": "missing.yaml"}}}, "does not exist"),
        ({"budget_minutes": -1}, "positive number"),
        ({"eval": {"samples": 0}}, "eval.samples"),
        ({"eval": {"sample": 3}}, "unknown eval keys"),
        ({"eval": {"temperature": -1}}, "eval.temperature"),
        ({"eval": {"fit_value": -1}}, "eval.fit_value"),
        ({"jobs": 0}, "jobs must be a whole number"),
        ({"jobs": 1.5}, "jobs must be a whole number"),
        ({"threads_per_model": 0}, "threads_per_model must be a whole number"),
        ({"threads_per_model": True}, "threads_per_model must be a whole number"),
    ],
)
def test_bad_experiment_files_are_usage_errors(tmp_path, changes, message):
    with pytest.raises(UsageError, match=message):
        load_experiment(str(write_experiment(tmp_path, **changes)))


def test_shipped_experiments_load():
    names = available_experiments()
    assert {"default", "nqueens8", "graph-coloring8"} <= set(names)
    for name in names:
        experiment = load_experiment(name)
        assert experiment.models and experiment.expected_minutes
        check_run_configs(experiment, None)  # every model's config builds as it trains


def test_lm_depth_tiers_beyond_training_are_longer_than_every_word_trained_and_the_others_are_not():
    experiment = load_experiment("lm-depth")
    (spec,) = experiment.models
    config = build_run_config(load_yaml(spec.config), spec.overrides)
    task = get_task(config.task.name, **config.task.options)
    longest = task.length[1]
    for name, options in experiment.eval.tiers.items():
        low, high = get_task(config.task.name, **{**config.task.options, **options}).test_length
        assert (low > longest) == ("beyond training" in name), name
        assert ("beyond training" in name) or high <= longest, name
    # The depths read include the training mean and twice it (the extrapolation target's two readings).
    mean = config.model.mean_recurrence
    assert {mean, 2 * mean} <= set(experiment.eval.depths)


def test_a_schedule_fitted_to_a_users_cap_passes_the_check_before_training():
    experiment = load_experiment("default", ["train.fit_steps=true"])
    check_run_configs(experiment, 21.0)  # train.fit_steps is valid once a time cap is set
    with pytest.raises(UsageError, match=r"fit_steps needs train\.budget_minutes"):
        check_run_configs(experiment, None)


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "no-such-experiment"], "unknown experiment"),
        (["run", "default", "--budget-minutes", "abc"], "positive number"),
        (["run", "default", "--budget-minutes", "0"], "positive number"),
        (["run", "default", "--budget-minutes", "nan"], "positive number"),
        (["run", "default", "--jobs", "0"], "--jobs"),
        (["run", "default", "--threads", "0"], "--threads"),
        (["run", "default", "--threads", "-1"], "--threads"),
        (["run", "default", "--schedule", "1.5"], "must be in (0, 1]"),
        (["run", "default", "train.seed=1", "train.seed=2"], "train.seed is set twice, to 1 and to 2"),
        (["run", "default", "--schedule", "0"], "--schedule must be a positive number"),
        (["run", "default", "--schedule", "abc"], "--schedule must be a positive number"),
        (["run", "seed=1"], "KEY=VALUE"),
        (["run", "default", "train.bogus=1"], "unknown config key 'train.bogus'"),
        (["run", "default", "model.dim=abc"], "model.dim"),
        (["run", "default", "eval.samples=0"], "eval.samples must be at least 1"),
        (["run", "default", "eval.sample=3"], "unknown config key 'sample'"),
    ],
)
def test_run_rejects_bad_input_with_one_line(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
    assert not (tmp_path / "runs").exists()  # refused before any model trained


def test_overrides_change_every_model_and_the_evaluation(tmp_path):
    path = str(
        write_experiment(tmp_path, models={"gram": {"config": "gram.yaml", "overrides": ["train.lr=1e-3"]}})
    )
    experiment = load_experiment(path, ["train.seed=3", "eval.samples=2", "eval.temperature=0.5"])
    assert experiment.models[0].overrides == ["train.lr=1e-3", "train.seed=3"]  # the file's own come first
    assert experiment.eval.samples == 2 and experiment.eval.steps == 2
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    assert results["overrides"] == ["train.seed=3", "eval.samples=2", "eval.temperature=0.5"]
    assert results["models"]["gram"]["eval"]["samples"] == 2
    assert results["models"]["gram"]["eval"]["temperature"] == 0.5
    assert "2 samples, 2 steps, sampling temperature 0.5" in report_markdown(results)
    saved = yaml.safe_load((tmp_path / "out" / "gram" / "config.yaml").read_text())
    assert saved["train"]["seed"] == 3 and saved["train"]["lr"] == 1e-3
    # The finished model was trained otherwise: rerunning without the override is refused, not mixed.
    with pytest.raises(UsageError, match="trained with overrides"):
        run_experiment(load_experiment(path), tmp_path / "out", progress=False, log=lambda _: None)


def test_a_model_s_own_eval_overrides_change_its_evaluation_alone(tmp_path):
    gram = {"config": "gram.yaml", "overrides": ["train.lr=1e-3", "eval.steps=3", "eval.samples=4"]}
    path = str(write_experiment(tmp_path, models={"gram": gram, "trm": {"config": "trm.yaml"}}))
    experiment = load_experiment(path, ["eval.samples=2"])
    gram_spec, trm_spec = experiment.models
    assert gram_spec.overrides == ["train.lr=1e-3"]  # the run config never sees eval.*
    assert gram_spec.eval_overrides == ["steps=3", "samples=4"]
    # The command line's eval.samples=2 wins over the model's own samples=4.
    assert (experiment.eval_for(gram_spec).steps, experiment.eval_for(gram_spec).samples) == (3, 2)
    assert (experiment.eval_for(trm_spec).steps, experiment.eval_for(trm_spec).samples) == (2, 2)
    assert experiment.evaluation_sets(gram_spec, "steps") and not experiment.evaluation_sets(
        trm_spec, "steps"
    )
    assert experiment.evaluation_sets(trm_spec, "samples")  # the command line's
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lambda _: None)
    assert len(results["models"]["gram"]["eval"]["curve_steps"]) == 3
    assert len(results["models"]["trm"]["eval"]["curve_steps"]) == 2
    assert results["models"]["gram"]["eval_overrides"] == ["steps=3", "samples=4"]
    assert "eval_overrides" not in results["models"]["trm"]


@pytest.mark.parametrize(
    "overrides, message",
    [(["eval.stepz=3"], "models.gram: eval override: unknown config key"), (["eval.steps=0"], "eval.steps")],
)
def test_a_model_s_own_eval_overrides_are_checked(tmp_path, overrides, message):
    path = write_experiment(tmp_path, models={"gram": {"config": "gram.yaml", "overrides": overrides}})
    with pytest.raises(UsageError, match=message):
        load_experiment(str(path))


def test_fit_value_fits_gram_s_value_head_before_evaluating_and_a_rerun_keeps_it(tmp_path):
    path = str(write_experiment(tmp_path))
    out = tmp_path / "out"
    lines: list[str] = []
    results = run_experiment(
        load_experiment(path, ["eval.fit_value=2"]), out, progress=False, log=lines.append
    )
    gram, trm = results["models"]["gram"]["eval"], results["models"]["trm"]["eval"]
    assert gram["value_fit"]["steps"] == 2 and gram["value_head"] == "fitted"
    assert "value_fit" not in trm and trm["value_head"] == "trained"  # deterministic: nothing to rank
    assert len(list((out / "gram" / "checkpoints").glob("*/value_head.safetensors"))) == 1
    assert "gram's value head was fitted to its own samples" in report_markdown(results)
    assert sum("fitting the value head" in line for line in lines) == 1
    lines.clear()
    run_experiment(load_experiment(path, ["eval.fit_value=2"]), out, progress=False, log=lines.append)
    assert (
        not any("fitting" in line for line in lines)
        and sum("evaluated already" in line for line in lines) == 2
    )


def test_run_rejects_unwritable_output_folder(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", str(write_experiment(tmp_path)), "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write to output folder") and "\n" not in err


def test_run_lists_experiments_with_their_minutes_on_the_reference_machine(capsys):
    from latentloop.experiments import REFERENCE_MACHINE

    assert main(["run", "--list"]) == 0
    captured = capsys.readouterr()
    assert "nqueens8" in captured.out and "default" in captured.out
    assert [line.split()[:2] for line in captured.out.splitlines() if line.startswith("default ")] == [
        ["default", f"~{load_experiment('default').expected_minutes:g}"]
    ]
    assert captured.err.strip() == f"minutes on the reference machine: {REFERENCE_MACHINE}"


def test_run_writes_the_results_file_section(tmp_path, capsys):
    results_file = tmp_path / "RESULTS.md"
    results_file.write_text("# Results\n\nintro kept\n")
    path = write_experiment(tmp_path)
    args = ["run", str(path), "--out", str(tmp_path / "out"), "--report", str(results_file)]
    assert main(args) == 0
    assert main(args) == 0  # the second run replaces the section instead of adding another
    text = results_file.read_text()
    assert "intro kept" in text and text.count("<!-- experiment: tiny -->") == 1
    assert f"latentloop run {path}" in text and "| gram |" in text
    assert "report:" in capsys.readouterr().out


def test_generative_baselines_are_evaluated_with_their_own_decoding_steps(tmp_path):
    run = {"arch": "ar", "model": TINY_MODEL, "train": TINY_TRAIN, "task": {"name": "nqueens", "n": 5}}
    (tmp_path / "ar.yaml").write_text(yaml.safe_dump(run))
    path = write_experiment(tmp_path, models={"ar": {"config": "ar.yaml"}, "trm": {"config": "trm.yaml"}})
    results = run_experiment(load_experiment(str(path)), tmp_path / "out", progress=False, log=lambda _: None)
    assert len(results["models"]["ar"]["eval"]["curve_steps"]) == 1  # one left-to-right pass
    assert len(results["models"]["trm"]["eval"]["curve_steps"]) == 2  # the experiment's supervision steps


def lm_experiment(tmp_path, evaluation: dict, task: dict | None = None):
    """A tiny ``kind: lm`` experiment of one model ("huginn", 2 training steps) with ``evaluation`` as its
    ``eval`` and ``task`` (when given) as the run's task, loaded from files written into ``tmp_path``."""
    lm = tiny_run(TINY_LM, train={"steps": 2, "eval_size": 0})
    if task is not None:
        lm["task"] = task
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(lm))
    spec = {
        "kind": "lm",
        "description": "tiny depth",
        "budget_minutes": 5,
        "models": {"huginn": {"config": "lm.yaml"}},
        "eval": evaluation,
    }
    (tmp_path / "depth.yaml").write_text(yaml.safe_dump(spec))
    return load_experiment(str(tmp_path / "depth.yaml"))


def test_lm_experiment_reports_the_metric_against_depth(tmp_path):
    experiment = lm_experiment(tmp_path, {"depths": [1, 3], "limit": 8})
    lines: list[str] = []
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lines.append)
    row = results["models"]["huginn"]
    assert row["train"]["step"] == 2 and row["train"]["parameters"] > 0
    assert [r["num_steps"] for r in row["eval"]["results"]] == [1, 3]
    assert all(r["n"] == 8 for r in row["eval"]["results"])
    assert row["eval"]["written"] == ["huginn/eval.json", "huginn/eval.md", "huginn/eval_depth.png"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| model | parameters | trained (min / steps) | r=1 | r=3 |" in report
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0
    # A rerun reuses the finished training and evaluation.
    lines.clear()
    run_experiment(experiment, tmp_path / "out", progress=False, log=lines.append)
    assert any("trained already" in line for line in lines) and any(
        "evaluated already" in line for line in lines
    )


def test_lm_experiment_reports_each_tier_and_the_depth_by_width_grid(tmp_path):
    evaluation = {
        "depths": [1, 2, 4],
        "limit": 6,
        "tiers": {"hops 1-2": {"test_hops": "1-2"}, "hops 3-4": {"test_hops": "3-4"}},
        "width": {"tier": "hops 3-4", "widths": [1, 2], "compute": 4, "limit": 3},
    }
    chains = {"name": "chains", "variables": 4, "hops": "1-2", "test_size": 6}
    experiment = lm_experiment(tmp_path, evaluation, chains)
    lines: list[str] = []
    results = run_experiment(experiment, tmp_path / "out", progress=False, log=lines.append)
    report = results["models"]["huginn"]["eval"]
    assert [t["tier"] for t in report["tiers"]] == ["hops 1-2", "hops 3-4"]
    assert all([r["num_steps"] for r in t["results"]] == [1, 2, 4] for t in report["tiers"])
    # r * K <= 4: K = 1 at r = 1, 2, 4 and K = 2 at r = 1, 2, each on the 3 problems of the tier asked for.
    cells = [(c["samples"], c["num_steps"]) for c in report["width"]["cells"]]
    assert cells == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2)]
    assert all(c["n"] == 3 for c in report["width"]["cells"])
    assert all({"single", "any"} <= set(c) for c in report["width"]["cells"] if c["samples"] > 1)
    text = (tmp_path / "out" / "report.md").read_text()
    assert (
        "| huginn | " in text
        and "| hops 3-4 |" in text
        and "| model | parameters | trained (min / steps) | tier |" in text
    )
    assert "depth x width on tier hops 3-4" in text and "Best at equal compute r * K: 1: r=1 K=1" in text
    assert "Share of the prompt positions" not in text  # chains labels the answer only
    lines.clear()
    run_experiment(experiment, tmp_path / "out", progress=False, log=lines.append)
    assert any("evaluated already" in line for line in lines)


def test_lm_experiment_reports_the_prefix_accuracy_of_a_task_trained_on_prefix_labels(tmp_path):
    evaluation = {"depths": [1, 2], "limit": 6, "tiers": {"length 5-6": {"test_length": "5-6"}}}
    permutations = {"name": "permutations", "length": "1-4", "prefix_labels": True, "test_size": 6}
    results = run_experiment(
        lm_experiment(tmp_path, evaluation, permutations), tmp_path / "out", progress=False
    )
    tier = results["models"]["huginn"]["eval"]["tiers"][0]
    shares = [r["prefix_accuracy"] for r in tier["results"]]
    text = (tmp_path / "out" / "report.md").read_text()
    table = text.split("Share of the prompt positions")[1]
    assert "| huginn | " in table and " | ".join(f"{100 * v:.1f}" for v in shares) + " |" in table


@pytest.mark.parametrize(
    "evaluation, message",
    [
        ({"tiers": ["hard"]}, "eval.tiers"),
        ({"tiers": {"hard": 3}}, "eval.tiers"),
        ({"width": {"widths": [0, 2]}}, "eval.width.widths"),
        ({"width": {"tier": "missing"}}, "not one of eval.tiers"),
        ({"width": {"compute": -1}}, "eval.width.compute"),
        ({"width": {"init_scale": 0}}, "eval.width.init_scale"),
        ({"width": {"budget": 3}}, "eval.width takes only"),
    ],
)
def test_lm_tiers_and_width_are_checked(tmp_path, evaluation, message):
    path = write_experiment(tmp_path, kind="lm", eval=evaluation)
    with pytest.raises(UsageError, match=message):
        load_experiment(str(path))


def test_lm_experiment_depths_are_checked(tmp_path):
    path = write_experiment(tmp_path, kind="lm", eval={"depths": [0, 2]})
    with pytest.raises(UsageError, match=r"eval\.depths"):
        load_experiment(str(path))
    path = write_experiment(tmp_path, kind="vision")
    with pytest.raises(UsageError, match="kind must be"):
        load_experiment(str(path))


def test_generation_experiment_samples_and_scores_each_model(tmp_path):
    train = {**TINY_TRAIN, "halt_weight": 0.0, "value_weight": 0.0, "augment": False}
    run = {"arch": "gram", "model": TINY_MODEL, "train": train, "task": {"name": "digits"}}
    (tmp_path / "gram.yaml").write_text(yaml.safe_dump(run))
    boards = {**run, "arch": "mdlm", "task": {"name": "sudoku", "n": 4, "unconditional": True}}
    (tmp_path / "sudoku.yaml").write_text(yaml.safe_dump({**boards, "train": {**train, "test_size": 4}}))
    spec = {
        "kind": "generation",
        "description": "tiny digits",
        "budget_minutes": 5,
        "models": {
            "gram": {"config": "gram.yaml"},
            "boards": {"config": "sudoku.yaml", "overrides": ["eval.steps=3", "eval.temperature=0.5"]},
        },
        "eval": {"samples": 6, "seed": 1},
    }
    (tmp_path / "digits.yaml").write_text(yaml.safe_dump(spec))
    results = run_experiment(
        load_experiment(str(tmp_path / "digits.yaml")), tmp_path / "out", progress=False, log=lambda _: None
    )
    sampled = results["models"]["gram"]["eval"]
    assert sampled["samples"] == 6 and 0 <= sampled["valid_fraction"] <= 1
    assert (
        sampled["image"] == "gram/samples.png" and sampled["run"] == "gram"
    )  # relative to the output folder
    assert {"inception_score", "frechet_distance"} <= set(sampled["scores"])
    assert (tmp_path / "out" / "gram" / "samples.png").stat().st_size > 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| gram |" in report and "| boards |" in report and "real held-out digits (6)" in report
    assert "`gram/samples.png`" in report and "`boards/samples.png`" not in report
    boards = results["models"]["boards"]["eval"]  # no picture and no scores: validity only
    assert boards["samples"] == 6 and "scores" not in boards and "image" not in boards
    # Each model samples at its own depth and temperature unless its overrides set them; all at the seed.
    assert (sampled["steps"], sampled["temperature"], sampled["seed"]) == (TINY_MODEL["n_sup"], 1.0, 1)
    assert (boards["steps"], boards["temperature"], boards["seed"]) == (3, 0.5, 1)
    assert f"| {TINY_MODEL['n_sup']} | 1 |" in report and "| 3 | 0.5 |" in report
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0


def test_arc_experiment_reports_pass_at_2(tmp_path):
    train = {**TINY_TRAIN, "steps": 2, "batch_size": 4, "train_size": 2, "test_size": 2, "augment": False}
    for arch in ("gram", "trm"):
        run = {"arch": arch, "model": {**TINY_MODEL, "dim": 8, "hidden": 8}, "train": train}
        run["task"] = {"name": "arc-agi-1", "augment": 1}
        (tmp_path / f"{arch}.yaml").write_text(yaml.safe_dump(run))
    spec = {
        "description": "tiny ARC",
        "budget_minutes": 5,
        "models": {"gram": {"config": "gram.yaml"}, "trm": {"config": "trm.yaml"}},
        "eval": {"samples": 2, "steps": 2},
    }
    (tmp_path / "arc.yaml").write_text(yaml.safe_dump(spec))
    results = run_experiment(load_experiment(str(tmp_path / "arc.yaml")), tmp_path / "out", progress=False)
    for row in results["models"].values():
        assert row["eval"]["metric"] == "pass@2" and row["eval"]["copies"] == 2 * row["eval"]["puzzles"]
    assert "accuracy is pass@2 over" in (tmp_path / "out" / "report.md").read_text()


def test_run_threads_sets_the_threads_every_model_trains_on(tmp_path, capsys):
    import torch

    before = torch.get_num_threads()
    out, report = tmp_path / "out", tmp_path / "RESULTS.md"
    try:
        args = [
            "run",
            str(write_experiment(tmp_path)),
            "--out",
            str(out),
            "--threads",
            "1",
            "--report",
            str(report),
        ]
        assert main(args) == 0
    finally:
        torch.set_num_threads(before)
    results = json.loads((out / "results.json").read_text())
    assert results["threads_per_model"] == 1
    assert {row["train"]["torch_threads"] for row in results["models"].values()} == {1}
    assert "--threads 1" in report.read_text()  # the command that reproduces the section
    # The threads per model decide the float rounding: the heading says how many.
    assert "(1 thread per model)" in (out / "report.md").read_text()


def test_a_shortened_schedule_shortens_the_reference_machines_minutes_with_it():
    from latentloop.experiments.training import scale_schedules

    experiment = scale_schedules(load_experiment("default"), 0.5)
    assert planned_steps(experiment) == {"gram": 2500, "trm": 1375}
    assert [spec.reference_minutes for spec in experiment.models] == [8.35, 7.3]
    assert experiment.expected_minutes is None and experiment.schedule_fraction == 0.5


def test_a_shortened_schedule_trains_that_share_of_every_models_steps_and_says_so(tmp_path, capsys):
    path = write_experiment(
        tmp_path, models={"gram": {"config": "gram.yaml", "overrides": ["train.steps=4"]}}
    )
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--schedule", "0.5"]) == 0
    results = json.loads((out / "results.json").read_text())
    train = results["models"]["gram"]["train"]
    assert (train["planned_steps"], train["step"], results["schedule_fraction"]) == (2, 2, 0.5)
    assert train["overrides"] == ["train.steps=4", "train.steps=2"]  # the experiment's own, then the share
    assert (
        "fixed schedules at 50% of the experiment's, the same on any machine: gram 2 steps"
        in (out / "report.md").read_text()
    )


def test_an_experiment_sets_only_the_eval_settings_its_kind_reads(tmp_path):
    from latentloop.experiments.spec import KIND_EVAL

    path = write_experiment(tmp_path)
    assert "depths" not in KIND_EVAL["reasoners"] and "samples" not in KIND_EVAL["lm"]
    with pytest.raises(
        UsageError, match=r"eval\.depths is not a setting of kind reasoners \(it reads samples"
    ):
        load_experiment(str(path), ["eval.depths=[1,2]"])
    path = write_experiment(tmp_path, eval={"samples": 3, "tiers": {}})
    with pytest.raises(UsageError, match=r"eval\.tiers is not a setting of kind reasoners"):
        load_experiment(str(path))
    path = write_experiment(
        tmp_path, models={"gram": {"config": "gram.yaml", "overrides": ["eval.width={}"]}}
    )
    with pytest.raises(UsageError, match=r"eval\.width is not a setting of kind reasoners"):
        load_experiment(str(path))
    lm = write_experiment(tmp_path, kind="lm", eval={"depths": [1, 2]})
    assert load_experiment(str(lm)).eval.depths == [1, 2]
