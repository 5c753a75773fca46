"""The claims dashboard of ``docs/RESULTS.md``: generated from the committed results, in step with them, with
statuses decided by each claim's rule and links that resolve."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from latentloop.cli import main
from latentloop.experiments.claims import (
    CLAIMS,
    FAMILIES,
    NOT,
    NOT_TRIED,
    PARTLY,
    REPRODUCED,
    STATUSES,
    Claim,
    Condition,
    Measure,
    Rule,
    evaluate,
    fill,
    load_catalog,
    measure_value,
    resolve,
    statuses,
)
from latentloop.experiments.results_page import (
    BEGIN,
    END,
    FIGURE,
    HEADLINE_BEGIN,
    HEADLINE_CELL,
    HEADLINE_END,
    HeadlineRow,
    headings,
    headline_rows,
    render_dashboard,
    render_figures,
    render_headline,
    results_base,
    split_block,
    with_reports,
    write_headline,
    write_results,
)
from tests.test_experiments import write_experiment

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "RESULTS.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _by_id(claim_id: str) -> Claim:
    [claim] = [c for c in CLAIMS if c.id == claim_id]
    return claim


def _write(base: Path, relative: str, data: dict) -> None:
    path = base / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _reasoners(**models: dict) -> dict:
    """A results.json of a reasoners experiment with ``models``: name -> eval fields (fractions)."""
    return {
        "kind": "reasoners",
        "budget_minutes_per_model": 30.0,
        "models": {
            name: {
                "train": {"parameters": 180_000, "train_minutes": 30.0, "flops": 1e14, "step": 100},
                "eval": {"accuracy_by_select": {"vote": fields.get("vote", 0.0)}, **fields},
            }
            for name, fields in models.items()
        },
    }


# The committed dashboard ----------------------------------------------------------------------------------------


def test_the_dashboard_is_regenerated_from_the_committed_results():
    text = RESULTS.read_text()
    _, block, _ = split_block(text)
    assert block is not None, "docs/RESULTS.md has no claims block"
    assert block == render_dashboard(text, RESULTS.parent), (
        "the claims dashboard of docs/RESULTS.md is stale: run `latentloop run --dashboard docs/RESULTS.md`"
    )


def test_every_link_of_the_dashboard_resolves():
    text = RESULTS.read_text()
    _, block, _ = split_block(text)
    assert block is not None
    anchors = {slug for _, _, slug in headings(text)}
    links = LINK.findall(block)
    assert links
    for target in links:
        if target.startswith("#"):
            assert target[1:] in anchors, target
        else:
            assert (RESULTS.parent / target).is_file(), target


def test_every_section_is_in_the_contents_and_every_tried_claim_has_its_file():
    text = RESULTS.read_text()
    before, block, after = split_block(text)
    contents = block.split("## Contents", 1)[1]
    for level, title, slug in headings(before + after):
        if level == 2:
            assert f"[{title}](#{slug})" in contents
    for claim in CLAIMS:
        sources = {m.source or claim.source for m in claim.measures.values()} if claim.source else set()
        assert all((RESULTS.parent / source).is_file() for source in sources), claim.id
        assert claim.family in FAMILIES
        assert (claim.source is None) == (claim.rule is None), claim.id


def test_the_committed_statuses():
    found = statuses(RESULTS.parent)
    assert set(found.values()) <= set(STATUSES)
    assert found["nq8-gram-vs-trm"] == REPRODUCED  # GRAM 98.0 / 97.4 against TRM 77.0 / 72.3
    assert found["nq8-gram-vs-generative"] == NOT  # MDLM's 100% vote is above GRAM's 98%
    assert found["gc8-gram-level"] == REPRODUCED  # coverage 88.3, 7 conflicts: within 5 of the paper's 2.7
    assert found["gram-ablation"] == REPRODUCED  # full 86.8, noise only 84.8, without guidance 64.4
    assert found["gram-ablation-nqueens"] == REPRODUCED  # full 97.0, without guidance 69.6, noise only 68.3
    assert found["unconditional-sudoku"] == PARTLY  # 6x6 99.2 / 97.7; 9x9 98.0 / 92.6, seed 1 below 99.05 - 5
    assert found["unconditional-digits"] == REPRODUCED  # GRAM FD 23.9 / 21.2 on both seeds, MDLM 62.0
    assert found["arc-agi-1"] == NOT
    assert found["nq10"] == PARTLY  # GRAM 32.0 / 16.4 and 41.0 / 20.5 against TRM 0 / 0; paper 89.7
    assert found["nq10-gram-vs-generative"] == REPRODUCED  # GRAM 32.0 and 41.0 by vote, AR 29.0, MDLM 19.0
    assert found["gc10"] == REPRODUCED  # GRAM 14 / 53.7 and 13 / 52.5 (two seeds) against TRM 584 / 3.1
    assert found["gc10-gram-vs-generative"] == PARTLY  # GRAM 14 and 13: fewer than AR 185, not MDLM 8
    assert found["sudoku9-depth"] == REPRODUCED  # TRM 0 -> 52.8 and 0 -> 54.2
    assert found["sudoku-width-vs-depth"] == REPRODUCED  # GRAM 77.4 / 87.4 against TRM 52.8 / 54.2
    assert found["sudoku9-gram-learns"] == PARTLY  # GRAM 48.2 / 60.4 against TRM 52.8 / 24.2 at 8 steps
    assert found["sudoku-width-vs-depth-prior-share"] == REPRODUCED  # 74.8 / 73.2 against 52.8 / 54.2
    assert found["sudoku9-gram-prior-share-learns"] == PARTLY  # 49.6 / 47.0 against TRM 52.8 / 24.2
    assert found["ptrm"] == REPRODUCED  # noisy TRM 61.0 and 26.8 against 52.8 and 24.2


# Status rules on hand-built results -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gram", "trm", "status"),
    [
        ((0.99, 0.95), (0.70, 0.40), REPRODUCED),
        ((0.99, 0.30), (0.70, 0.40), PARTLY),  # accuracy above, coverage below
        ((0.60, 0.30), (0.70, 0.40), NOT),
        ((0.70, 0.40), (0.70, 0.40), NOT),  # equal is not above
    ],
)
def test_gram_against_trm_on_nqueens(tmp_path, gram, trm, status):
    _write(
        tmp_path,
        "results/nqueens8-fast/results.json",
        _reasoners(
            gram={"vote": gram[0], "coverage": gram[1]},
            trm={"vote": trm[0], "coverage": trm[1]},
        ),
    )
    result = evaluate(_by_id("nq8-gram-vs-trm"), tmp_path)
    assert result.status == status
    assert result.figure == (
        f"GRAM {100 * gram[0]:.1f} / {100 * gram[1]:.1f}, TRM {100 * trm[0]:.1f} / {100 * trm[1]:.1f}"
    )


@pytest.mark.parametrize(
    ("gram", "status"),
    [
        ((2, 0.90), REPRODUCED),
        ((7, 0.81), REPRODUCED),  # within 5 of the paper's 2.7 conflicts and 85.8 coverage
        ((17, 0.873), PARTLY),
        ((17, 0.50), NOT),
    ],
)
def test_gram_at_the_papers_graph_colouring_level(tmp_path, gram, status):
    conflicts, coverage = gram
    _write(
        tmp_path,
        "results/default/results.json",
        _reasoners(gram={"conflicts_total": conflicts, "coverage": coverage}),
    )
    assert evaluate(_by_id("gc8-gram-level"), tmp_path).status == status


def test_every_deterministic_model_counts(tmp_path):
    models = {m: {"coverage": 0.2, "vote": 0.5} for m in ("direct", "looped", "hrm", "trm")}
    models |= {m: {"coverage": 0.9, "vote": 0.9} for m in ("ar", "mdlm", "gram")}
    _write(tmp_path, "results/nqueens8-fast/results.json", _reasoners(**models))
    claim = _by_id("nq8-generative-coverage")
    assert evaluate(claim, tmp_path).status == REPRODUCED
    models["looped"]["coverage"] = 0.95  # one deterministic model above the generative ones
    _write(tmp_path, "results/nqueens8-fast/results.json", _reasoners(**models))
    result = evaluate(claim, tmp_path)
    assert result.status == NOT
    assert result.values["det_max"] == pytest.approx(95.0)


@pytest.mark.parametrize(
    ("gram", "status"),
    [
        ((1.0, 0.95, 0.95, 0.95), REPRODUCED),
        ((1.0, 0.93, 0.95, 0.95), PARTLY),
        ((1.0, 1.0, 0.95, 0.9), PARTLY),  # one 9x9 seed below the paper's level
        ((1.0, 1.0, 0.5, 0.5), PARTLY),  # the paper's level on 6x6 alone
        ((0.5, 0.6, 0.0, 0.0), PARTLY),
        ((0.5, 0.0, 1.0, 1.0), NOT),
        ((0.0, 0.0, 0.0, 0.0), NOT),
    ],
)
def test_unconditional_sudoku_needs_both_gram_seeds_and_the_9x9_boards(tmp_path, gram, status):
    names = ("gram-seed-0", "gram-seed-1", "gram-9x9", "gram-9x9-seed-1", "mdlm")
    valid = dict(zip(names, (*gram, 1.0), strict=True))
    data = {
        "models": {
            m: {"train": {"parameters": 1, "train_minutes": 5.0}, "eval": {"valid_fraction": v}}
            for m, v in valid.items()
        },
    }
    _write(tmp_path, "results/sudoku-unconditional/results.json", data)
    assert evaluate(_by_id("unconditional-sudoku"), tmp_path).status == status


def test_a_tie_at_the_ceiling_is_partly(tmp_path):
    _write(tmp_path, "results/sudoku-scaling/results.json", _reasoners(gram={"vote": 1.0}, trm={"vote": 1.0}))
    assert evaluate(_by_id("sudoku-gram-vs-trm"), tmp_path).status == PARTLY


def test_a_claim_without_a_results_file_is_not_tried(tmp_path):
    assert evaluate(_by_id("nq8-gram-vs-trm"), tmp_path).status == NOT_TRIED  # its file is missing here
    result = evaluate(_by_id("arc-agi-2"), tmp_path)  # no file named at all
    assert (result.status, result.figure) == (NOT_TRIED, "no results file")


def test_rules_and_conditions():
    rule = Rule((Condition("a", ">", "b"), Condition("c", "<=", 3.0, 1.0)))
    assert rule.status({"a": 2, "b": 1, "c": 4}) == REPRODUCED
    assert rule.status({"a": 2, "b": 1, "c": 4.5}) == PARTLY
    assert rule.status({"a": 1, "b": 1, "c": 5}) == NOT
    assert rule.status({"a": None, "b": 1, "c": 9}) == NOT  # a missing value holds nothing
    assert rule.text() == "reproduced if a > b and c ≤ 3 + 1; partly if some of these hold"
    explicit = Rule((Condition("a", ">=", 5),), (Condition("a", ">=", 2),))
    assert [explicit.status({"a": a}) for a in (6, 3, 1)] == [REPRODUCED, PARTLY, NOT]
    assert Condition("a", ">=", "b", -5).text() == "a ≥ b − 5"


def test_field_paths():
    data = {
        "models": {
            "x": {
                "curve": [{"steps": 1, "acc": 0.25}, {"steps": 8, "acc": 0.75}],
                "cells": [
                    {"curve": "depth", "steps": 8, "acc": 0.5},
                    {"curve": "width", "steps": 8, "acc": 0.9},
                    {"curve": "width", "steps": 4, "acc": 0.7},
                ],
                "ok": True,
            },
            "y": {"curve": [{"steps": 1, "acc": 0.5}], "ok": False},
        }
    }
    assert resolve(data, "models.x.curve[steps=8].acc") == [0.75]
    assert resolve(data, "models.x.curve[-1].steps") == [8]
    assert sorted(resolve(data, "models.*.curve[*].acc")) == [0.25, 0.5, 0.75]
    assert resolve(data, "models.z.curve") == []
    assert resolve(data, "models.x.cells[curve=width,steps=8].acc") == [0.9]  # every term must hold
    assert resolve(data, "models.x.cells[curve=width].acc") == [0.9, 0.7]
    assert resolve(data, "models.x.cells[curve=depth,steps=4].acc") == []
    assert resolve({"gate": {"0.5": {"x": 1}, "0": {"x": 2}}}, "gate[0.5].x") == [1]  # a key with a dot
    assert resolve({"gate": {"0.5": {"x": 1}}}, "gate.0.5.x") == []
    assert measure_value(Measure(("models.*.curve[steps=1].acc",), 100.0, "min"), data) == 25.0
    assert measure_value(Measure(("models.*.ok",), reduce="sum"), data) == 1.0
    assert measure_value(Measure(("models.*.ok",), reduce="count"), data) == 2.0
    assert measure_value(Measure(("models.z.acc",)), data) is None
    with pytest.raises(ValueError, match="reduce"):
        measure_value(Measure(("models.*.curve[steps=1].acc",)), data)


# Writing the block ------------------------------------------------------------------------------------------------


def _results_file(tmp_path: Path) -> Path:
    _write(
        tmp_path,
        "results/nqueens8-fast/results.json",
        _reasoners(gram={"vote": 0.99, "coverage": 0.97}, trm={"vote": 0.77, "coverage": 0.72}),
    )
    path = tmp_path / "RESULTS.md"
    write_results(path, ("nqueens8-fast", "## nqueens8-fast\n\nCommand: `latentloop run nqueens8-fast`\n"))
    return path


def test_the_block_is_inserted_before_the_sections_and_rewritten_in_place(tmp_path):
    path = _results_file(tmp_path)
    claims = [_by_id("nq8-gram-vs-trm"), _by_id("arc-agi-2")]
    assert write_results(path, claims=claims, dashboard=True)
    text = path.read_text()
    assert text.index(BEGIN) < text.index(END) < text.index("<!-- experiment: nqueens8-fast -->")
    assert (
        '| <a id="claim-nq8-gram-vs-trm"></a>N-Queens 8x8: GRAM above TRM in accuracy and coverage |' in text
    )
    assert "[nqueens8-fast](#nqueens8-fast); `latentloop run nqueens8-fast`" in text
    assert "2 claims: 1 reproduced, 0 partly, 0 not, 1 not tried." in text
    assert not write_results(path, claims=claims)  # nothing changed
    # A rerun of the experiment replaces its section and keeps the block (rewritten in the same write); a new
    # one is appended after it.
    section = "## nqueens8-fast\n\nCommand: `latentloop run nqueens8-fast --out x`\n"
    assert write_results(path, ("nqueens8-fast", section), claims=claims)
    assert write_results(path, ("maze", "## maze\n\nCommand: `latentloop run maze`\n"), claims=claims)
    text = path.read_text()
    assert text.count(BEGIN) == 1 and text.count("## nqueens8-fast") == 1
    assert "`latentloop run nqueens8-fast --out x`" in text
    assert "- Maze: [maze](#maze)" in text
    assert text.index(END) < text.index("## nqueens8-fast") < text.index("## maze")


def test_the_command_line_rewrites_the_block(tmp_path, capsys):
    path = _results_file(tmp_path)
    path.write_text(
        path.read_text().replace("## nqueens8-fast", f"{BEGIN}\nstale text\n{END}\n\n## nqueens8-fast", 1)
    )
    assert main(["run", "--dashboard", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"updated {path}"
    _, block, _ = split_block(path.read_text())
    assert block is not None and "## Claims dashboard" in block and "stale text" not in block
    assert main(["run", "--dashboard", str(tmp_path / "missing.md")]) == 2


def test_a_run_with_report_regenerates_the_block_of_a_file_that_has_one(tmp_path):
    results_file = tmp_path / "RESULTS.md"
    results_file.write_text(f"# Results\n\nintro kept\n\n{BEGIN}\nstale text\n{END}\n")
    path = write_experiment(tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--report", str(results_file)]) == 0
    text = results_file.read_text()
    _, block, after = split_block(text)
    assert block == render_dashboard(text, tmp_path)
    assert "stale text" not in block and "- Benchmarks and other: [tiny](#tiny)" in block
    assert "<!-- experiment: tiny -->" in after and "intro kept" in text


# The claims file ---------------------------------------------------------------------------------------------------


def test_conditions_and_measures_read_from_their_yaml_forms():
    assert Condition.parse("gram0 >= trm0 - 2") == Condition("gram0", ">=", "trm0", -2.0)
    assert Condition.parse("speedup > 1.5") == Condition("speedup", ">", 1.5)
    assert Condition.parse("a < b + 0.5") == Condition("a", "<", "b", 0.5)
    assert Measure.parse("models.x.acc") == Measure(("models.x.acc",))
    assert Measure.parse({"paths": ["a", "b"], "scale": 100, "reduce": "max"}) == Measure(
        ("a", "b"), 100.0, "max"
    )
    for bad in ("a => b", "a > ", "a > b + c"):
        with pytest.raises(ValueError, match="is not"):
            Condition.parse(bad)
    with pytest.raises(ValueError, match="unknown keys"):
        Measure.parse({"path": "a", "scaling": 100})
    with pytest.raises(ValueError, match="reduce"):
        Measure.parse({"path": "a", "reduce": "mean"})


def _catalog_file(tmp_path: Path, claim: str) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(f"families: {{lm: LM}}\nclaims:\n{claim}")
    return path


def test_the_claims_file_is_checked(tmp_path):
    good = "- {id: a, family: lm, text: t, paper: p, source: r.json, measures: {x: f}, rule: {reproduced: [x > 1]}}\n"
    catalog = load_catalog(_catalog_file(tmp_path, good))
    assert catalog.claim("a").rule == Rule((Condition("x", ">", 1.0),))
    assert catalog.families == ("LM",) and catalog.claim("a").family == "LM"
    for bad in (
        good.replace("family: lm", "family: gram"),  # no such family
        good.replace(", rule: {reproduced: [x > 1]}", ""),  # a results file and no rule
        good.replace("text: t", "txt: t"),  # an unknown key
        good + good,  # the id twice
    ):
        with pytest.raises(ValueError):
            load_catalog(_catalog_file(tmp_path, bad))


def test_every_template_names_only_its_measures_and_the_constants():
    for claim in CLAIMS:
        nones = dict.fromkeys(claim.measures)
        for template in (claim.figure, claim.scale):
            fill(template, nones)  # a name it lacks raises KeyError


# The README's headline table ---------------------------------------------------------------------------------------

README = ROOT / "README.md"


def test_the_readme_headline_is_regenerated_from_the_committed_results():
    text = README.read_text()
    match = HEADLINE_BEGIN.search(text)
    assert match is not None and match.group(1) == "docs/RESULTS.md"
    block = text[match.start() : text.index(HEADLINE_END) + len(HEADLINE_END)]
    assert block == render_headline("docs/RESULTS.md", RESULTS.parent), (
        "README.md's headline table is stale: run `latentloop run --dashboard README.md`"
    )
    anchors = {f"claim-{claim.id}" for claim in CLAIMS}
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(headline_rows())
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert all(len(c) <= HEADLINE_CELL for c in cells[:2]), row
        assert cells[2].split("#", 1)[1].rstrip(")") in anchors


def test_a_headline_cell_over_the_limit_is_refused(tmp_path):
    _write(tmp_path, "results/default/results.json", _reasoners(gram={"conflicts_total": 7, "coverage": 0.9}))
    short = HeadlineRow("main job", "gc8-gram-level", "GRAM {conf:.0f} conflicts")
    assert "| main job | GRAM 7 conflicts | [reproduced](R.md#claim-gc8-gram-level) |" in render_headline(
        "R.md", tmp_path, [short]
    )
    with pytest.raises(ValueError, match="200 characters"):
        render_headline("R.md", tmp_path, [HeadlineRow("main job", "gc8-gram-level", "x" * 201)])


def test_write_headline_rewrites_only_its_block(tmp_path):
    models = {
        "gram": {"conflicts_total": 7, "coverage": 0.9},
        "trm": {"conflicts_total": 90, "coverage": 0.2},
    }
    _write(tmp_path, "docs/results/default/results.json", _reasoners(**models))
    readme = tmp_path / "README.md"
    readme.write_text(
        "# top\n\n<!-- headline:begin docs/RESULTS.md -->\nstale\n<!-- headline:end -->\n\ntail\n"
    )
    assert main(["run", "--dashboard", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# top\n\n<!-- headline:begin docs/RESULTS.md -->") and text.endswith(
        "end -->\n\ntail\n"
    )
    assert "stale" not in text and "| [reproduced](docs/RESULTS.md#claim-gc8-gram-vs-trm) |" in text
    assert "conflicts 7 against 90; coverage 90.0% against 20.0%" in text
    assert not write_headline(readme)


# Figures in prose ---------------------------------------------------------------------------------------------------


def test_every_generated_figure_of_the_docs_is_fresh():
    pages = [
        README,
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "results").glob("*/README.md")),
    ]
    found = 0
    for page in pages:
        text = page.read_text()
        found += len(FIGURE.findall(text))
        assert render_figures(text, results_base(page)) == text, (
            f"{page.name}: a generated figure is stale; run `latentloop run --dashboard {page.relative_to(ROOT)}`"
        )
    assert found >= 3


def test_a_figure_is_filled_from_its_claims_measures(tmp_path):
    models = {
        "gram": {"conflicts_total": 7, "coverage": 0.9},
        "trm": {"conflicts_total": 90, "coverage": 0.2},
    }
    _write(tmp_path, "results/default/results.json", _reasoners(**models))
    (tmp_path / "RESULTS.md").write_text("# Results\n")
    page = tmp_path / "topic.md"
    marker = '<!-- figure: gc8-gram-vs-trm "GRAM {gram_conf:.0f} against {trm_conf:.0f} conflicts" -->'
    page.write_text(f"Text {marker}stale<!-- /figure --> more.\n")
    assert main(["run", "--dashboard", str(page)]) == 0
    assert page.read_text() == f"Text {marker}GRAM 7 against 90 conflicts<!-- /figure --> more.\n"
    assert (tmp_path / "RESULTS.md").read_text() == "# Results\n"  # a topic page gets no dashboard


def test_a_figure_is_filled_from_the_fields_of_a_results_file(tmp_path):
    """A figure whose source is a .json file names the file's fields by path, with their format specs."""
    runs = [{"clients": 1, "tok_s": 20.16}, {"clients": 8, "tok_s": 90.594}]
    _write(tmp_path, "bench/speed.json", {"runs": runs, "ratio": 4.4937, "same": True, "machine": "EPYC"})
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "RESULTS.md").write_text("# Results\n")  # the page's figures read beside it
    page = tmp_path / "docs" / "topic.md"
    template = (
        "{runs[clients=8].tok_s:.1f} tokens/s, {ratio:.2f}x on {machine}; same: {same:yesno}; {ratio:.0%}"
    )
    marker = f'<!-- figure: ../bench/speed.json "{template}" -->'
    page.write_text(f"Served {marker}stale<!-- /figure -->.\n")
    assert main(["run", "--dashboard", str(page)]) == 0
    assert (
        page.read_text() == f"Served {marker}90.6 tokens/s, 4.49x on EPYC; same: yes; 449%<!-- /figure -->.\n"
    )


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{runs[*].tok_s:.1f}", "field 'runs[*].tok_s' matches 2 values, not one"),
        ("{speed:.1f}", "field 'speed' matches 0 values, not one"),
    ],
)
def test_a_figure_whose_field_is_not_one_value_is_a_one_line_error(tmp_path, capsys, template, error):
    _write(tmp_path, "speed.json", {"runs": [{"tok_s": 20.16}, {"tok_s": 90.6}]})
    (tmp_path / "RESULTS.md").write_text("# Results\n")
    page = tmp_path / "topic.md"
    page.write_text(f'<!-- figure: speed.json "{template}" -->old<!-- /figure -->\n')
    assert main(["run", "--dashboard", str(page)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: speed.json: the figure's {error}"]
    assert "old" in page.read_text()  # nothing written


def test_every_report_is_regenerated_byte_identical_from_its_committed_results():
    """The experiments' sections of RESULTS.md and each results folder's report.md are the reports their
    committed results.json render to: `latentloop run --dashboard docs/RESULTS.md` rewrites any that are not."""
    from latentloop.experiments.report import report_markdown

    text = RESULTS.read_text()
    assert with_reports(text, RESULTS.parent) == text, "a section of docs/RESULTS.md is stale"
    reports = 0
    for results in sorted((RESULTS.parent / "results").glob("*/results.json")):
        report = results.parent / "report.md"
        if report.is_file():
            reports += 1
            assert report.read_text() == report_markdown(json.loads(results.read_text())), report
    assert reports >= 20
