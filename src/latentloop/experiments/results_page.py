"""``docs/RESULTS.md``: its one writer.

The page holds a generated claims dashboard between ``<!-- claims:begin -->`` and ``<!-- claims:end -->``, and
the experiments' own sections, each between ``<!-- experiment: NAME -->`` markers. :func:`write_results`
replaces (or appends) one experiment's section and regenerates the dashboard in the same write
(``latentloop run EXPERIMENT --report docs/RESULTS.md``; ``latentloop run --dashboard docs/RESULTS.md`` for
the dashboard alone). Nothing in the dashboard is typed by hand: the figures are read from the committed files
through :mod:`latentloop.experiments.claims`, the commands from the ``Command:`` lines of the sections it links
to, and the contents list from the page's ``## `` headings.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from latentloop.errors import UsageError
from latentloop.experiments.claims import (
    CATALOG,
    CLAIMS_FILE,
    NOT,
    NOT_TRIED,
    PARTLY,
    REPRODUCED,
    STATUSES,
    Claim,
    Value,
    evaluate,
    fill,
    resolve,
)
from latentloop.experiments.report import report_markdown
from latentloop.io import atomic_write_text

BEGIN = "<!-- claims:begin -->"
END = "<!-- claims:end -->"
# The README's headline table: its begin marker names the results page whose claims it shows.
HEADLINE_BEGIN = re.compile(r"<!-- headline:begin (\S+) -->")
HEADLINE_END = "<!-- headline:end -->"
HEADLINE_CELL = 200  # characters at most in a cell of the headline table
OTHER = CATALOG.families[-1]  # where a section that claims.yaml does not name is listed


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading (before the ``-N`` suffix of repeated headings)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str, str]]:
    """The headings of a markdown text outside code fences: (level, title, anchor), anchors made unique as
    GitHub makes them."""
    found, seen, fenced = [], {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"^(#{1,6}) +(.+?) *#*$", line)
        if fenced or not match:
            continue
        slug = anchor(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.append((len(match.group(1)), match.group(2), slug if count == 0 else f"{slug}-{count}"))
    return found


def split_block(text: str, begin: str = BEGIN, end: str = END) -> tuple[str, str | None, str]:
    """``text`` as (before, block, after) around the generated block (markers included); ``block`` is ``None``
    when the text has no complete block."""
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    if start < 0 or stop < 0:
        return text, None, ""
    stop += len(end)
    return text[:start], text[start:stop], text[stop:]


def _sections(text: str) -> dict[str, str]:
    """Each ``## `` section's text (up to the next ``## `` heading), by title."""
    sections: dict[str, str] = {}
    parts = re.split(r"^## +(.+?) *$", text, flags=re.MULTILINE)
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        sections.setdefault(title, body)
    return sections


def _command(section: str | None) -> str | None:
    match = re.search(r"Command: `([^`]+)`", section or "")
    return " ".join(match.group(1).split()) if match else None


def row_anchor(claim_id: str) -> str:
    """The anchor of a claim's row in the dashboard."""
    return f"claim-{claim_id}"


def cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def render_dashboard(text: str, base: Path, claims: Sequence[Claim] = CATALOG.claims) -> str:
    """The generated block (markers included) for a RESULTS.md whose text is ``text`` and whose results files
    lie under ``base``."""
    before, _, after = split_block(text)
    outside = before + after
    anchors = {title: slug for level, title, slug in headings(outside) if level == 2}
    sections = _sections(outside)
    cache: dict[Path, Any] = {}
    results = [evaluate(claim, base, cache) for claim in claims]
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    lines = [
        BEGIN,
        "<!-- Generated from the committed results files by `latentloop run --dashboard docs/RESULTS.md`"
        " (src/latentloop/experiments/claims.yaml); do not edit by hand. -->",
        "",
        "## Claims dashboard",
        "",
        "Each claim of the papers (Huginn; GRAM and its baselines; later work on them) with the paper's figure"
        " and latentloop's, read by code from the committed results file linked in its row"
        " (`src/latentloop/experiments/claims.yaml` names the file, the fields and the conditions that decide"
        " the status). Percentages unless a unit is given.",
        "",
        f"{len(results)} claims: {counts[REPRODUCED]} reproduced, {counts[PARTLY]} partly, {counts[NOT]} not,"
        f" {counts[NOT_TRIED]} not tried.",
    ]
    for family in CATALOG.families:
        rows = [r for r in results if r.claim.family == family]
        if not rows:
            continue
        lines += [
            "",
            f"**{family}**",
            "",
            "| claim | paper | latentloop | scale gap | status | where |",
            "|---|---|---|---|---|---|",
        ]
        for result in rows:
            claim = result.claim
            where = []
            if claim.section is not None and claim.section in anchors:
                where.append(f"[{claim.section}](#{anchors[claim.section]})")
            command = _command(sections.get(claim.section or "")) or claim.command
            if command:
                where.append(f"`{command}`")
            if claim.source is not None and result.status != NOT_TRIED:
                where.append(f"[{Path(claim.source).name}]({claim.source})")
            text = f'<a id="{row_anchor(claim.id)}"></a>{claim.text}'
            cells = [text, claim.paper, result.figure, result.scale or "-", result.status]
            lines.append("| " + " | ".join(cell(c) for c in [*cells, "; ".join(where) or "-"]) + " |")
    lines += ["", "How each status is decided (names are the measures of the claim in `claims.yaml`):", ""]
    lines += [f"- {r.claim.id}: {r.claim.rule.text()}" for r in results if r.claim.rule is not None]
    lines += ["", "## Contents", ""]
    grouped: dict[str, list[str]] = {family: [] for family in CATALOG.families}
    for level, title, slug in headings(outside):
        if level == 2:
            grouped[CATALOG.sections.get(title, OTHER)].append(f"[{title}](#{slug})")
    lines += [f"- {family}: {', '.join(links)}" for family, links in grouped.items() if links]
    lines.append(END)
    return "\n".join(lines)


def _with_section(text: str, experiment: str, section: str) -> str:
    """``text`` with ``experiment``'s section (between its markers) replaced, or appended when it has none."""
    begin, end = f"<!-- experiment: {experiment} -->", f"<!-- /experiment: {experiment} -->"
    block = f"{begin}\n{section.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip() + "\n\n" + block + "\n"


def _with_dashboard(text: str, block: str) -> str:
    """``text`` with ``block`` in place of its generated block, or before its first section when it has none."""
    before, old, after = split_block(text)
    if old is not None:
        return before + block + after
    match = re.search(r"^(<!-- experiment: |## )", text, flags=re.MULTILINE)
    if match is None:
        return text.rstrip() + "\n\n" + block + "\n"
    return text[: match.start()] + block + "\n\n" + text[match.start() :]


_SECTION = re.compile(r"<!-- experiment: (\S+) -->\n(.*?)\n<!-- /experiment: \1 -->", re.DOTALL)


def with_reports(text: str, base: Path) -> str:
    """A results page's ``text`` with every experiment section whose run is committed (``base/results/NAME``
    holding the run's results.json and report.md) rendered anew from its results, keeping the section's
    ``Command:`` line."""

    def rendered(match: re.Match[str]) -> str:
        name, body = match.group(1), match.group(2)
        results = base / "results" / name / "results.json"
        if not (results.is_file() and results.with_name("report.md").is_file()):
            return match.group(0)
        markdown = report_markdown(json.loads(results.read_text()), _command(body))
        return f"<!-- experiment: {name} -->\n{markdown.rstrip()}\n<!-- /experiment: {name} -->"

    return _SECTION.sub(rendered, text)


def write_folder_reports(base: Path) -> list[Path]:
    """Rewrite each ``base/results/*/report.md`` that lies beside a results file from it; the ones changed."""
    changed = []
    for results in sorted(base.glob("results/*/results.json")):
        report = results.parent / "report.md"
        if not report.is_file():
            continue
        markdown = report_markdown(json.loads(results.read_text()))
        if report.read_text() != markdown:
            atomic_write_text(report, markdown)
            changed.append(report)
    return changed


def write_results(
    path: Path,
    section: tuple[str, str] | None = None,
    claims: Sequence[Claim] = CATALOG.claims,
    dashboard: bool | None = None,
) -> bool:
    """Write the results page ``path``: ``section`` = ``(experiment, markdown)`` replaces or appends that
    experiment's section; the dashboard is then regenerated from the results under the page's folder
    (``dashboard``: always, or only when the page already has one, the default). One atomic write. Returns
    whether the page changed."""
    old = path.read_text() if path.is_file() else "# Results\n"
    text = old if section is None else _with_section(old, *section)
    if dashboard or (dashboard is None and split_block(text)[1] is not None):
        text = _with_dashboard(text, render_dashboard(text, path.parent, claims))
    if text == old and path.is_file():
        return False
    atomic_write_text(path, text)
    return True


@dataclass(frozen=True)
class HeadlineRow:
    """A row of the README's headline table: what was measured (``result``), the claim it reads, and the template
    of its ``measured`` cell over that claim's measures (the claim's figure when empty)."""

    result: str
    claim: str
    measured: str = ""


def headline_rows(path: Path = CLAIMS_FILE) -> list[HeadlineRow]:
    """The headline rows of the claims file."""
    return [HeadlineRow(**row) for row in yaml.safe_load(path.read_text()).get("headline", [])]


def render_headline(page: str, base: Path, rows: Sequence[HeadlineRow] | None = None) -> str:
    """The README's headline table (markers included) from the claims measured under ``base``, the folder of
    the results page ``page`` (the link written in the table, relative to the README). Raises ValueError when a
    cell is longer than :data:`HEADLINE_CELL`."""
    lines = [
        f"<!-- headline:begin {page} -->",
        "<!-- Generated from the committed results by `latentloop run --dashboard README.md`"
        " (src/latentloop/experiments/claims.yaml); do not edit by hand. -->",
        "",
        "| result | measured | status |",
        "|---|---|---|",
    ]
    cache: dict[Path, Any] = {}
    for row in headline_rows() if rows is None else rows:
        result = evaluate(CATALOG.claim(row.claim), base, cache)
        measured = fill(row.measured, result.values) if row.measured and result.values else result.figure
        if max(len(row.result), len(measured)) > HEADLINE_CELL:
            raise ValueError(f"headline row of {row.claim}: a cell over {HEADLINE_CELL} characters")
        status = f"[{result.status}]({page}#{row_anchor(row.claim)})"
        lines.append(f"| {cell(row.result)} | {cell(' '.join(measured.split()))} | {status} |")
    lines.append(HEADLINE_END)
    return "\n".join(lines)


def write_headline(path: Path) -> bool:
    """Regenerate the headline table of the markdown file ``path`` (a README) from the results page its block
    names. Returns whether the file changed; a file without the block is left alone."""
    text = path.read_text()
    match = HEADLINE_BEGIN.search(text)
    stop = text.find(HEADLINE_END, match.end()) if match else -1
    if match is None or stop < 0:
        return False
    page = match.group(1)
    block = render_headline(page, (path.parent / page).parent)
    new = text[: match.start()] + block + text[stop + len(HEADLINE_END) :]
    if new == text:
        return False
    atomic_write_text(path, new)
    return True


# A figure in prose, generated: <!-- figure: SOURCE "TEMPLATE" -->TEXT<!-- /figure -->, TEXT the template filled.
# SOURCE is a claim's id (the template names its measures, claims.fill) or a results file ending in .json, relative
# to the folder of RESULTS.md (the template names the file's fields by path: {speed.ratio:.2f}).
FIGURE = re.compile(r'<!-- figure: (\S+) "([^"]*)" -->(.*?)<!-- /figure -->', re.DOTALL)


class _FileFields(string.Formatter):
    """A template whose fields are paths into one results file (the syntax of claims.Measure); each must name
    exactly one number, truth value or word."""

    def __init__(self, data: Any, name: str) -> None:
        self.data, self.name = data, name

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        found = resolve(self.data, field_name)
        if len(found) != 1 or not isinstance(found[0], (int, float, str)):
            raise UsageError(
                f"{self.name}: the figure's field {field_name!r} matches {len(found)} values, not one"
            )
        return (found[0] if isinstance(found[0], str) else Value(found[0])), field_name


def file_figure(path: Path, template: str, cache: dict[Path, Any]) -> str:
    """``template`` filled with the fields of the results file ``path``."""
    if path not in cache:
        if not path.is_file():
            raise UsageError(f"a generated figure reads {path}, which does not exist")
        cache[path] = json.loads(path.read_text())
    return _FileFields(cache[path], path.name).format(template)


def render_figures(text: str, base: Path) -> str:
    """``text`` with every generated figure filled from the claims measured under ``base`` or from the results
    file it names (relative to ``base``)."""
    cache: dict[Path, Any] = {}

    def filled(match: re.Match[str]) -> str:
        source, template = match.group(1), match.group(2)
        if source.endswith(".json"):
            value = file_figure(base / source, template, cache)
        else:
            result = evaluate(CATALOG.claim(source), base, cache)
            value = fill(template, result.values) if result.values else result.figure
        return f'<!-- figure: {source} "{template}" -->{value}<!-- /figure -->'

    return FIGURE.sub(filled, text)


def results_base(path: Path) -> Path:
    """The folder whose results files a markdown page's figures read: the nearest folder above the page that
    holds RESULTS.md (docs/, for its pages and the READMEs of docs/results/), else the page's docs/ folder (the
    README)."""
    for folder in path.resolve().parents:
        if (folder / "RESULTS.md").is_file():
            return folder
    return path.parent / "docs"


def regenerate(path: Path) -> bool:
    """Regenerate the generated blocks of the markdown file ``path``: a README's headline table, the figures
    in prose of any page, and a results page's dashboard (inserted when missing in a page that has neither of
    the others). Returns whether the file changed."""
    text = path.read_text()
    changed = write_headline(path) if HEADLINE_BEGIN.search(text) else False
    text = path.read_text()
    figures = render_figures(text, results_base(path))
    if figures != text:
        atomic_write_text(path, figures)
        changed = True
    if HEADLINE_BEGIN.search(text) or (FIGURE.search(text) and path.name != "RESULTS.md"):
        return changed
    if split_block(text)[1] is not None:  # a results page: its experiments' reports are generated too
        changed = bool(write_folder_reports(path.parent)) or changed
        sections = with_reports(text, path.parent)
        if sections != text:
            atomic_write_text(path, sections)
            changed = True
    return write_results(path, dashboard=True) or changed
