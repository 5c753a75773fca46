"""Every relative link in the README and in ``docs/*.md`` resolves: the file or folder it names exists, and the
``#anchor`` it names is a heading (or an ``<a id>``/``<a name>``) of the Markdown file it points to, under
GitHub's anchor rules. The README stays a short front page that links every topic page."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TOPIC_PAGES = ("lm", "reasoners", "tasks", "cli", "training", "official-formats", "benchmarks")
README_COMMANDS = (
    "bash scripts/setup.sh && .venv/bin/latentloop run",
    "bash scripts/setup.sh && .venv/bin/python -m pytest",
)

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``(number, line)`` of the lines outside fenced code blocks, inline code spans blanked."""
    lines, fenced = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence and (fenced is None or fence.group(1) == fenced):
            fenced = fence.group(1) if fenced is None else None
            continue
        if fenced is None:
            lines.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lowercased, every character but letters, digits,
    spaces, hyphens and underscores dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file: its headings' slugs (a repeated one numbered ``-1``, ``-2``, ... as GitHub
    numbers them) and its HTML ``id``/``name`` anchors."""
    text = path.read_text(encoding="utf-8")
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = None
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence and (fenced is None or fence.group(1) == fenced):
            fenced = fence.group(1) if fenced is None else None
            continue
        if fenced is not None:
            continue
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """``FILE:LINE: TARGET (why)`` for each relative link of ``path`` that does not resolve."""
    broken = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            target = match.group(1)
            if SCHEME.match(target) or target.startswith("//"):
                continue  # a URL: not checked offline
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(root)}:{number}: {target}"
            resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
                broken.append(f"{where} (no such anchor in {resolved.name})")
    return broken


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_every_relative_link_and_anchor_resolves():
    broken = [entry for path in documents() for entry in broken_links(path)]
    if broken:
        pytest.fail(f"{len(broken)} broken link(s):\n" + "\n".join(broken), pytrace=False)


def test_the_readme_is_short_and_links_every_topic_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for command in README_COMMANDS:
        assert f"```bash\n{command}\n```" in readme, command
    linked = {
        match.group(1).partition("#")[0] for _, line in prose_lines(readme) for match in LINK.finditer(line)
    }
    for page in TOPIC_PAGES:
        assert f"docs/{page}.md" in linked, page
        assert (DOCS / f"{page}.md").is_file(), page


def test_slugs_follow_githubs_rules():
    assert slug("Time to accuracy: GRAM on N-Queens 8x8 in minutes instead of hours") == (
        "time-to-accuracy-gram-on-n-queens-8x8-in-minutes-instead-of-hours"
    )
    assert slug("`compare_huginn_reference.py`: against the official huginn-0125 code") == (
        "compare_huginn_referencepy-against-the-official-huginn-0125-code"
    )
    assert slug("Official formats, the [Hub](https://huggingface.co) and lm-eval") == (
        "official-formats-the-hub-and-lm-eval"
    )


def test_the_check_finds_broken_links_and_passes_good_ones(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A section: here\n\n## Twice\n\n## Twice\n")
    (tmp_path / "README.md").write_text(
        "See [the page](docs/page.md), [a section](docs/page.md#a-section-here), [again](docs/page.md#twice-1),\n"
        "[top](#readme), [web](https://example.org/x.md#nowhere), ![a picture](docs/missing.png),\n"
        "[gone](docs/gone.md), [no anchor](docs/page.md#nowhere), `[code](docs/gone.md)`.\n\n"
        "# Readme\n\n```\n[in a block](docs/gone.md)\n```\n"
    )
    assert broken_links(tmp_path / "README.md", root=tmp_path) == [
        "README.md:2: docs/missing.png (no such file)",
        "README.md:3: docs/gone.md (no such file)",
        "README.md:3: docs/page.md#nowhere (no such anchor in page.md)",
    ]


def layout_entries(readme: str) -> dict[str, str]:
    """The README's Layout block: each folder (``src/latentloop/x/``) with its text, continuation lines joined."""
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    folder = None
    for line in block.splitlines():
        if line.startswith("src/") or line.startswith("tests/"):
            folder, _, text = line.partition(" ")
            entries[folder] = text
        elif line.strip() and folder is not None:
            entries[folder] += " " + line.strip()
    return entries


def test_the_readme_layout_names_every_module_of_the_package():
    entries = layout_entries((ROOT / "README.md").read_text(encoding="utf-8"))
    package = ROOT / "src" / "latentloop"
    skipped = {"benchmarks", "configs", "resources"}  # scripts and files, described as a whole
    for folder in sorted({p.parent for p in package.rglob("*.py")}):
        relative = folder.relative_to(ROOT).as_posix() + "/"
        if folder.relative_to(package).parts[:1] and folder.relative_to(package).parts[0] in skipped:
            continue
        text = entries.get(relative)
        if text is None:  # a subfolder named in its parent's line: "sudoku/: task, solver"
            text = entries[folder.parent.relative_to(ROOT).as_posix() + "/"]
            assert f"{folder.name}/" in text, relative
        words = set(re.findall(r"[a-z_]+", text))
        modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "__main__"}
        assert modules <= words, f"{relative}: {sorted(modules - words)} missing from the README's Layout"
    for folder in entries:
        assert (ROOT / folder).exists(), folder
