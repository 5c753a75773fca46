"""Reporting an experiment from its ``results.json``: the summary rows, the Markdown report, the curves and
the example boards.

Every number shown comes from the results, so a report can be rewritten later without running anything again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latentloop.eval.reasoners import plot_boards
from latentloop.io import atomic_path
from latentloop.tasks.base import get_task
from latentloop.train.run_config import load_reasoner_run_config

TIME_TO_ACCURACY = "time-to-accuracy"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_flops(value: float | None) -> str:
    """FLOPs as ``1.23e14`` (``-`` when unknown)."""
    if value is None:
        return "-"
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _minutes(value: float) -> str:
    return f"{value:.3g}"


def _cost(point: dict[str, Any] | None) -> str:
    """``minutes / examples / FLOPs`` of a curve point, or ``not reached``."""
    if point is None:
        return "not reached"
    return f"{_minutes(point['train_minutes'])} / {point['examples_seen']:,} / {format_flops(point['flops'])}"


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per model: the headline numbers of the table (for ``kind: lm``, the metric by depth; for
    ``kind: time-to-accuracy``, the final checkpoint's and when each target was first reached)."""
    if results.get("kind") == TIME_TO_ACCURACY:
        rows = []
        for name, row in results["models"].items():
            final = row["summary"]["final"] or {}
            rows.append(
                {
                    "model": name,
                    "parameters": row["train"]["parameters"],
                    "config": row["config"],
                    "adds": row["adds"],
                    "checkpoints": row["summary"]["points"],
                    "batches": final.get("step"),
                    "train_minutes": final.get("train_minutes"),
                    "examples_seen": final.get("examples_seen"),
                    "flops": final.get("flops"),
                    "accuracy_vote": final.get("accuracy"),
                    "accuracy_value": final.get("accuracy_value"),
                    "accuracy_1_sample": final.get("accuracy_1_sample"),
                    "coverage": final.get("coverage"),
                    "conflicts_total": None,
                    "targets": {m: t["reached"] for m, t in row["summary"]["targets"].items()},
                }
            )
        return rows
    if results.get("kind") == "generation":
        rows = []
        for name, row in results["models"].items():
            report, scores = row["eval"], row["eval"].get("scores", {})
            rows.append(
                {
                    "model": name,
                    "parameters": row["train"]["parameters"],
                    "train_minutes": row["train"]["train_minutes"],
                    "batches": row["train"]["step"],
                    "samples": report["samples"],
                    "samples_per_s": report["samples_per_s"],
                    "valid_fraction": report["valid_fraction"],
                    "distinct": report["distinct"],
                    "inception_score": scores.get("inception_score"),
                    "frechet_distance": scores.get("frechet_distance"),
                }
            )
        return rows
    if results.get("kind") == "lm":
        rows = []
        for name, row in results["models"].items():
            metric = row["eval"]["metric"]
            tiers = row["eval"].get("tiers") or [{"tier": None, "results": row["eval"]["results"]}]
            rows += [
                {
                    "model": name,
                    "tier": tier["tier"],
                    "parameters": row["train"]["parameters"],
                    "train_minutes": row["train"]["train_minutes"],
                    "steps": row["train"]["step"],
                    "metric": metric,
                    "by_depth": {r["num_steps"]: r[metric] for r in tier["results"]},
                    "prefix_by_depth": {
                        r["num_steps"]: r["prefix_accuracy"]
                        for r in tier["results"]
                        if "prefix_accuracy" in r
                    },
                }
                for tier in tiers
            ]
        return rows
    rows = []
    for name, row in results["models"].items():
        report, train = row["eval"], row["train"]
        by_select = report.get("accuracy_by_select", {})
        rows.append(
            {
                "model": name,
                "parameters": train["parameters"],
                "train_minutes": train["train_minutes"],
                "batches": train["step"],
                "examples_seen": train["examples_seen"],
                "flops": train.get("flops"),  # absent from results written before FLOPs were counted
                "accuracy_vote": by_select.get("vote"),
                "accuracy_value": by_select.get("value"),
                "accuracy_1_sample": report["curve_samples"][0]["vote"],
                "coverage": report.get("coverage"),
                "conflicts_total": report.get("conflicts_total"),
            }
        )
    return rows


def schedule_sentence(results: dict[str, Any]) -> str:
    """How much each model trained, as the report's heading says it: the fixed schedules (the same on any
    machine), or under a time cap "time-capped: N of M planned steps" for each model the cap stopped, which is
    then not the experiment's reference result. Results written before schedules were fixed (no
    ``planned_steps``) trained for a wall-clock budget and say so."""
    trained = {name: row["train"] for name, row in results["models"].items()}
    if not all("planned_steps" in t for t in trained.values()):
        minutes = results.get("budget_minutes_per_model")
        return f"training budget {minutes:g} min of wall-clock per model (a schedule fitted to the minutes)"
    steps = ", ".join(f"{name} {t['planned_steps']:,}" for name, t in trained.items())
    capped = {name: t for name, t in trained.items() if t.get("time_capped")}
    fraction = results.get("schedule_fraction", 1.0)
    share = "" if fraction == 1 else f" at {100 * fraction:g}% of the experiment's"
    if not capped:
        return f"fixed schedules{share}, the same on any machine: {steps} steps"
    stopped = ", ".join(
        f"{name} {t['step']:,} of {t['planned_steps']:,} planned steps" for name, t in capped.items()
    )
    return (
        f"time-capped at {results['budget_minutes_per_model']:g} min per model: {stopped} "
        f"(not the reference result; planned: {steps} steps)"
    )


def _report_heading(results: dict[str, Any], details: str, command: str | None) -> list[str]:
    """The lines every report starts with: title, description, where and how it was measured, the command."""
    machine_ = results["machine"]
    jobs, threads = results.get("jobs", 1), results.get("threads_per_model")
    # The threads per model decide the float rounding, so a rerun matches bit for bit only with as many.
    together = ""
    if threads and jobs > 1:
        together = f" ({jobs} models at a time, {threads} thread{'s' * (threads > 1)} each)"
    elif threads:
        together = f" ({threads} thread{'s' * (threads > 1)} per model)"
    cpu = f"{machine_['cpu']}, " if machine_.get("cpu") else ""
    lines = [
        f"## {results['experiment']}",
        "",
        results["description"],
        "",
        f"Measured on {results['date']} ({cpu}{machine_['cpus']} CPUs, torch {machine_['torch']}, "
        f"{machine_['device']}); {schedule_sentence(results)}{together}{details}.",
    ]
    return lines + (["", f"Command: `{command}`"] if command else [])


def _lm_report_markdown(results: dict[str, Any], command: str | None) -> str:
    rows = summary_rows(results)
    lines = _report_heading(results, "", command)
    metric = rows[0]["metric"].replace("_", " ")
    lines += _lm_depth_table(
        rows, "by_depth", f"Held-out {metric} against test-time depth (recurrent-core iterations)"
    )
    if any(r["prefix_by_depth"] for r in rows):
        lines += _lm_depth_table(
            rows,
            "prefix_by_depth",
            "Share of the prompt positions whose greedy token is the intermediate result that training labels them "
            "with (for permutations: the letters whose running product the model names), the same problems",
        )
    for name, row in results["models"].items():
        if row["eval"].get("width"):
            lines += ["", *_width_table(name, row["eval"]["width"])]
    for name, paper in results["paper"].items():
        lines += ["", f"Paper ({name}): " + "; ".join(f"{k} {v}" for k, v in paper.items())]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def _lm_depth_table(rows: list[dict[str, Any]], key: str, title: str) -> list[str]:
    """One Markdown table of ``row[key]`` (depth -> value) per model and tier, under ``title``."""
    depths = sorted({d for r in rows for d in r[key]})
    tiered = any(r["tier"] is not None for r in rows)
    lines = [
        "",
        title + (", one row per held-out tier" if tiered else "") + ":",
        "",
        "| model | parameters | trained (min / steps) | "
        + ("tier | " if tiered else "")
        + " | ".join(f"r={d}" for d in depths)
        + " |",
        "|---|---|---|" + ("---|" if tiered else "") + "---|" * len(depths),
    ]
    for r in rows:
        values = r[key]
        cells = [
            "-"
            if values.get(d) is None
            else (_pct(values[d]) if key != "by_depth" or r["metric"] != "perplexity" else f"{values[d]:.2f}")
            for d in depths
        ]
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['steps']} | "
            + (f"{r['tier']} | " if tiered else "")
            + " | ".join(cells)
            + " |"
        )
    return lines


def _width_table(model: str, width: dict[str, Any]) -> list[str]:
    """The depth x width grid as Markdown: majority-vote exact match by width K (rows) and depth r (columns),
    then the best cell at each compute r * K."""
    cells = width["cells"]
    depths = sorted({c["num_steps"] for c in cells})
    by = {(c["samples"], c["num_steps"]): c for c in cells}
    tier = f" on tier {width['tier']}" if width.get("tier") else ""
    lines = [
        f"{model}: depth x width{tier} ({cells[0]['n']} problems; K latent trajectories from random initial "
        f"states, scale {width['init_scale']:g}, answered by majority vote; r * K up to {width['compute']:g}):",
        "",
        "| width K | " + " | ".join(f"r={d}" for d in depths) + " |",
        "|---|" + "---|" * len(depths),
    ]
    for k in sorted({c["samples"] for c in cells}):
        lines.append(
            f"| {k} | "
            + " | ".join(_pct(by[k, d]["exact_match"]) if (k, d) in by else "-" for d in depths)
            + " |"
        )
    best = []
    for compute in sorted({c["samples"] * c["num_steps"] for c in cells}):
        at = [c for c in cells if c["samples"] * c["num_steps"] == compute]
        top = max(at, key=lambda c: (c["exact_match"], -c["samples"]))
        best.append(f"{compute:g}: r={top['num_steps']} K={top['samples']} ({_pct(top['exact_match'])})")
    return [*lines, "", "Best at equal compute r * K: " + "; ".join(best) + "."]


def _generation_report_markdown(results: dict[str, Any], command: str | None) -> str:
    rows = summary_rows(results)
    details = f"; {rows[0]['samples']} samples per model at its own default depth"
    if results["eval"].get("temperature", 1.0) != 1.0:
        details += f", sampling temperature {results['eval']['temperature']}"
    lines = _report_heading(results, details, command)
    scored = any(r["inception_score"] is not None for r in rows)
    header = "| model | parameters | trained (min / batches) | samples/s | valid (%) | distinct |"
    rule = "|---|---|---|---|---|---|"
    if scored:
        header, rule = header + " inception score | Fréchet distance |", rule + "---|---|"
    lines += ["", header, rule]

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for r in rows:
        line = (
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['batches']} | "
            f"{r['samples_per_s']:.1f} | {_pct(r['valid_fraction'])} | {r['distinct']} |"
        )
        if scored:
            line += f" {num(r['inception_score'])} | {num(r['frechet_distance'])} |"
        lines.append(line)
    reference = next(
        (row["eval"]["reference"] for row in results["models"].values() if "reference" in row["eval"]), None
    )
    if reference is not None:
        lines.append(
            f"| real held-out digits ({reference['images']}) | - | - | - | - | - | "
            f"{num(reference['inception_score'])} | {num(reference['frechet_distance'])} |"
        )
    pictures = [f"`{name}/samples.png`" for name, row in results["models"].items() if "image" in row["eval"]]
    if pictures:
        lines += ["", "Samples: " + ", ".join(pictures) + "."]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _gain_line(gain: dict[str, Any], targets: dict[str, float]) -> str:
    """One row's gain over the row before it: the time-to-target ratios where both reach a target, else (or
    for a target not reached by both) the differences in final accuracy and coverage."""
    adds = f" (+ {', '.join(gain['adds'])})" if gain["adds"] else ""
    parts = []
    for metric, target in targets.items():
        ratio = gain["time_to_target_ratio"][metric]
        label = f"{metric} ≥ {target:g}%"
        parts.append(
            f"{label} reached {ratio:.2f}x as fast"
            if ratio is not None
            else f"{label}: not reached by both rows"
        )
    if not targets or any(r is None for r in gain["time_to_target_ratio"].values()):

        def points(value: float | None) -> str:
            return "-" if value is None else f"{100 * value:+.1f} points"

        parts.append(
            f"final accuracy {points(gain['accuracy_difference'])}, coverage {points(gain['coverage_difference'])}"
        )
    return f"- {gain['model']}{adds} over {gain['over']}: " + "; ".join(parts)


def _time_to_accuracy_report_markdown(results: dict[str, Any], command: str | None) -> str:
    ev, targets = results["eval"], results.get("targets", {})
    rows = summary_rows(results)
    curves = [row["curve"] for row in results["models"].values() if row["curve"]]
    split = ev.get("split", "test")
    puzzles = f"{curves[0][-1]['puzzles']} {split} puzzles, " if curves else ""
    details = (
        f"; a checkpoint every {ev['every']} batches, each evaluated on {puzzles}{_count(ev['samples'], 'sample')}, "
        f"{ev['steps']} steps"
    )
    if ev.get("temperature", 1.0) != 1.0:
        details += f", sampling temperature {ev['temperature']}"
    lines = _report_heading(results, details, command)
    header = (
        "| model | adds | checkpoints | accuracy, 1 sample | accuracy, vote | coverage | "
        "trained (min / examples / FLOPs) |"
    )
    rule = "|---|---|---|---|---|---|---|"
    for metric, target in targets.items():
        header += f" {metric} ≥ {target:g}% first at (min / examples / FLOPs) |"
        rule += "---|"
    lines += ["", "Final checkpoint of each model, and when each target was first reached:", "", header, rule]
    for r in rows:
        adds = ", ".join(f"`{a}`" for a in r["adds"]) or "-"
        trained = "-" if r["train_minutes"] is None else _cost(r)
        line = (
            f"| {r['model']} | {adds} | {r['checkpoints']} | {_pct(r['accuracy_1_sample'])} | "
            f"{_pct(r['accuracy_vote'])} | {_pct(r['coverage'])} | {trained} |"
        )
        for metric in targets:
            line += f" {_cost(r['targets'][metric])} |"
        lines.append(line)
    if results.get("ablation"):
        lines += [
            "",
            "Ablation, each row against the one before it (time-to-target ratio: the row before's training "
            "minutes over this row's, above 1 is sooner):",
            "",
            *(_gain_line(gain, targets) for gain in results["ablation"]),
        ]
    lines += ["", "Accuracy and coverage against training minutes, examples seen and FLOPs: `curves.png`."]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def report_markdown(results: dict[str, Any], command: str | None = None) -> str:
    """The experiment's table (ours beside the paper's) and its curves as Markdown."""
    if results.get("kind") == TIME_TO_ACCURACY:
        return _time_to_accuracy_report_markdown(results, command)
    if results.get("kind") == "lm":
        return _lm_report_markdown(results, command)
    if results.get("kind") == "generation":
        return _generation_report_markdown(results, command)
    ev = results["eval"]
    rows = summary_rows(results)
    has_cov = any(r["coverage"] is not None for r in rows)
    has_conf = any(r["conflicts_total"] is not None for r in rows)
    first = next(iter(results["models"].values()))["eval"]
    details = f"; {first['puzzles']} {ev.get('split', 'test')} puzzles, {ev['samples']} samples, {ev['steps']} steps"
    if ev.get("temperature", 1.0) != 1.0:
        details += f", sampling temperature {ev['temperature']}"
    if first.get("metric"):  # ARC: accuracy is pass@2 over the augmented copies of each test input
        details += f"; accuracy is {first['metric']} over {first['copies']} augmented copies"
    lines = _report_heading(results, details, command)
    header = (
        "| model | parameters | trained (min / batches / FLOPs) | accuracy, 1 sample | accuracy, vote | "
        "accuracy, value |"
    )
    rule = "|---|---|---|---|---|---|"
    if has_cov:
        header, rule = header + " coverage |", rule + "---|"
    if has_conf:
        header, rule = header + " conflicts (total) |", rule + "---|"
    if results["paper"]:
        header, rule = header + " paper |", rule + "---|"
    lines += ["", header, rule]
    for r in rows:
        line = (
            f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']:.1f} / {r['batches']} / "
            f"{format_flops(r['flops'])} | {_pct(r['accuracy_1_sample'])} | {_pct(r['accuracy_vote'])} | {_pct(r['accuracy_value'])} |"
        )
        if has_cov:
            line += f" {_pct(r['coverage'])} |"
        if has_conf:
            line += " - |" if r["conflicts_total"] is None else f" {r['conflicts_total']} |"
        if results["paper"]:
            paper = results["paper"].get(r["model"], {})
            line += " " + (" / ".join(f"{k} {v:g}" for k, v in paper.items()) or "-") + " |"
        lines.append(line)
    fitted = {
        name: row["eval"]["value_fit"]
        for name, row in results["models"].items()
        if "value_fit" in row["eval"]
    }
    for name, fit in fitted.items():
        auc = "n/a" if fit.get("held_out_auc") is None else f"{fit['held_out_auc']:.3f}"
        lines += [
            "",
            f"{name}'s value head was fitted to its own samples after training (`latentloop fit-value`, "
            f"{fit['steps']} updates on {fit['rollouts']:,} rollouts, {fit['seconds']:.0f} s, not counted in "
            f"the training budget); ROC AUC for a valid last-step answer on {fit['held_out_rollouts']} fresh rollouts: "
            f"{auc}.",
        ]
    curves = {name: row["eval"] for name, row in results["models"].items()}
    steps = sorted({p["steps"] for report in curves.values() for p in report["curve_steps"]})
    shown_steps = [s for s in steps if s <= 4 or s in (8, 16, 32) or s == steps[-1]]
    lines += [
        "",
        "Accuracy (vote) against depth: supervision steps (MDLM: unmasking steps; AR decodes in one pass):",
        "",
        "| model | " + " | ".join(str(s) for s in shown_steps) + " |",
        "|---|" + "---|" * len(shown_steps),
    ]
    for name, report in curves.items():
        by_step = {p["steps"]: p["accuracy"] for p in report["curve_steps"]}
        lines.append(f"| {name} | " + " | ".join(_pct(by_step.get(s)) for s in shown_steps) + " |")
    ks = [k for k in (1, 2, 5, 10, 20, 50, 100) if k <= ev["samples"]]
    if ev["samples"] not in ks:
        ks.append(ev["samples"])
    lines += [
        "",
        "Against samples at the last step: vote / value" + (" / coverage" if has_cov else ""),
        "",
        "| model | " + " | ".join(str(k) for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    for name, report in curves.items():
        by_k = {p["samples"]: p for p in report["curve_samples"]}
        cells = []
        for k in ks:
            p = by_k[k]
            parts = [_pct(p["vote"]), _pct(p["value"])] + ([_pct(p.get("coverage"))] if has_cov else [])
            cells.append(" / ".join(parts))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if any(row["eval"].get("examples") for row in results["models"].values()):
        lines += ["", "A few answers of each model, solved puzzles first, drawn in `boards.png`."]
    if results.get("paper_note"):
        lines += ["", results["paper_note"]]
    return "\n".join(lines) + "\n"


def _save_figure(fig: Any, path: Path, plt: Any) -> None:
    """Lay ``fig`` out, write it to ``path`` as a PNG atomically, and close it."""
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, format="png", dpi=110)
    plt.close(fig)


def _plot_time_to_accuracy(results: dict[str, Any], path: Path, plt: Any) -> None:
    """Accuracy (top) and coverage (bottom, for tasks with several solutions) against training minutes,
    examples seen and FLOPs, one line per model, the targets dashed; points without FLOPs are left out of the
    FLOPs column. ``plt``: pyplot."""
    curves = [p for row in results["models"].values() for p in row["curve"]]
    metrics = [("accuracy", "accuracy (vote)")]
    if any(p.get("coverage") is not None for p in curves):
        metrics.append(("coverage", "coverage"))
    fig, axes = plt.subplots(len(metrics), 3, figsize=(12.6, 3.5 * len(metrics)), squeeze=False)
    columns = (("train_minutes", "training minutes"), ("examples_seen", "examples seen"), ("flops", "FLOPs"))
    targets = results.get("targets", {})
    for name, row in results["models"].items():
        for r, (metric, _) in enumerate(metrics):
            for c, (cost, _) in enumerate(columns):
                points = [p for p in row["curve"] if p.get(cost) is not None and p.get(metric) is not None]
                if points:
                    axes[r][c].plot(
                        [p[cost] for p in points], [p[metric] for p in points], "o-", label=name, markersize=3
                    )
    for r, (metric, label) in enumerate(metrics):
        for c, (_, xlabel) in enumerate(columns):
            ax = axes[r][c]
            if metric in targets:
                ax.axhline(targets[metric] / 100, color="gray", linestyle="--", linewidth=1)
            ax.set(xlabel=xlabel, ylabel=label, ylim=(-0.02, 1.02))
            ax.grid(alpha=0.3)
    drawn = [ax for ax in axes.flat if ax.get_legend_handles_labels()[0]]
    if drawn:
        drawn[0].legend(fontsize=8)
    fig.suptitle(results["experiment"])
    _save_figure(fig, path, plt)


def plot_results(results: dict[str, Any], path: Path) -> None:
    """Accuracy against steps, accuracy against samples and coverage against samples, every model (for
    ``kind: time-to-accuracy``, accuracy and coverage against minutes, examples seen and FLOPs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    if results.get("kind") == TIME_TO_ACCURACY:
        _plot_time_to_accuracy(results, path, plt)
        return
    if results.get("kind") == "generation":  # the models' sample grids side by side
        # An image is named relative to the output folder (where ``path`` goes), or by older results as given.
        grids = [(name, row["eval"].get("image")) for name, row in models.items()]
        grids = [
            (name, path.parent / image if (path.parent / image).is_file() else Path(image))
            for name, image in grids
            if image
        ]
        grids = [(name, image) for name, image in grids if image.is_file()]
        if not grids:
            return
        fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 4.4), squeeze=False)
        for ax, (name, image) in zip(axes[0], grids, strict=True):
            ax.imshow(plt.imread(image))
            ax.set_title(name)
            ax.axis("off")
        _save_figure(fig, path, plt)
        return
    if results.get("kind") == "lm":
        grids = [(name, row["eval"]["width"]) for name, row in models.items() if row["eval"].get("width")]
        rows = summary_rows(results)
        curves = [("by_depth", rows[0]["metric"].replace("_", " "))]
        if any(row["prefix_by_depth"] for row in rows):
            curves.append(("prefix_by_depth", "prompt positions right (prefix labels)"))
        panels = len(curves) + len(grids)
        fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 4.6), squeeze=False)
        one_model = len(models) == 1
        for ax, (key, ylabel) in zip(axes[0], curves, strict=False):
            for row in rows:
                depths = sorted(row[key])
                if row["tier"] is None:
                    label = row["model"]
                else:
                    label = row["tier"] if one_model else f"{row['model']}, {row['tier']}"
                ax.plot(depths, [row[key][d] for d in depths], "o-", label=label, markersize=3)
            ax.set(xscale="log", xlabel="test-time depth (core iterations)", ylabel=ylabel)
            ax.grid(alpha=0.3)
            # Below the axes: with many tiers a legend inside would hide the curves.
            ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        for ax, (name, width) in zip(axes[0][len(curves) :], grids, strict=True):
            for k in sorted({c["samples"] for c in width["cells"]}):
                at = sorted((c for c in width["cells"] if c["samples"] == k), key=lambda c: c["num_steps"])
                ax.plot(
                    [c["num_steps"] * k for c in at], [c["exact_match"] for c in at], "o-", label=f"K={k}"
                )
            ax.set(
                xscale="log",
                xlabel="test-time compute r * K (core iterations x trajectories)",
                ylabel="exact match, majority vote",
            )
            ax.set_title(
                f"{name}: depth x width" + (f"\n{width['tier']}" if width.get("tier") else ""), fontsize=9
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(results["experiment"])
        _save_figure(fig, path, plt)
        return
    has_cov = any("coverage" in row["eval"] for row in models.values())
    panels = 3 if has_cov else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6))
    for name, row in models.items():
        report = row["eval"]
        axes[0].plot(
            [p["steps"] for p in report["curve_steps"]], [p["accuracy"] for p in report["curve_steps"]], "o-",
            label=name, markersize=3,
        )  # fmt: skip
        ks = [p["samples"] for p in report["curve_samples"]]
        (vote,) = axes[1].plot(
            ks, [p["vote"] for p in report["curve_samples"]], "o-", label=name, markersize=3
        )
        axes[1].plot(
            ks, [p["value"] for p in report["curve_samples"]], ":", color=vote.get_color(), alpha=0.7
        )
        if has_cov and "coverage" in report:
            axes[2].plot(ks, [p["coverage"] for p in report["curve_samples"]], "o-", label=name, markersize=3)
    axes[0].set(xlabel="supervision steps", ylabel="accuracy (vote)", title="depth")
    axes[1].set(xlabel="samples", ylabel="accuracy: vote (dotted: value head)", title="width")
    if has_cov:
        axes[2].set(xlabel="samples", ylabel="coverage", title="distinct solutions found")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(results["experiment"])
    _save_figure(fig, path, plt)


def plot_example_boards(results: dict[str, Any], out: Path) -> None:
    """``boards.png``: a few answers of every model (solved ones first), where the task can draw them."""
    examples = {
        name: row["eval"]["examples"]
        for name, row in results["models"].items()
        if row["eval"].get("examples")
    }
    if not examples:
        return
    config = load_reasoner_run_config(out / next(iter(examples)) / "config.yaml")
    task = get_task(config.task.name, **config.task.options)
    if task.drawable:
        plot_boards(examples, task, out / "boards.png")
