"""The committed documents name no path of the machine that wrote them: reports, results and configs under
``docs/`` read the same on any machine (``latentloop run`` writes relative paths; see
:mod:`latentloop.experiments.runner`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
TEXT_SUFFIXES = (".json", ".jsonl", ".md", ".yaml", ".yml")
# A path that starts at a machine's root folder (/home/..., /work/..., /tmp/...), not one inside a URL or a
# relative path (``runs/tmp/x``, ``https://host/home``: a word character, '.', '~' or '/' comes before it);
# or one on a Windows drive (``C:\...``, ``C:/...``).
ROOTS = ("home", "work", "tmp", "root", "Users", "mnt", "opt", "var", "private", "srv", "scratch")
ABSOLUTE = re.compile(
    rf"(?<![\w.~/:-])/(?:{'|'.join(ROOTS)})/[^\s\"'`)\]]*|(?<![\w])[A-Za-z]:(?:\\\\?|/)[\w.-][^\s\"'`)\]]*"
)


def absolute_paths(folder: Path) -> list[str]:
    """``FILE:LINE: PATH`` for every absolute machine path in the text files under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            found += [f"{path.relative_to(folder)}:{number}: {m.group(0)}" for m in ABSOLUTE.finditer(line)]
    return found


def test_no_committed_document_names_an_absolute_machine_path():
    found = absolute_paths(DOCS)
    if found:
        pytest.fail(
            f"{len(found)} absolute path(s) of a machine in docs/ (write them relative to the run folder or "
            "the repository):\n" + "\n".join(found[:50]),
            pytrace=False,
        )


def test_the_scan_finds_planted_paths_and_passes_relative_ones(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.json").write_text(
        '{\n "file": "/work/main/configs/experiments/default.yaml",\n'
        ' "written": ["C:\\\\Users\\\\me\\\\runs\\\\gram\\\\eval.json", "gram/eval.json"]\n}\n'
    )
    (tmp_path / "report.md").write_text("See `/home/me/runs/x` and (/tmp/r130/eval.json).\n")
    (tmp_path / "fine.md").write_text(
        "Relative: `runs/tmp/x`, configs/experiments/default.yaml, ../nqueens8-gram.yaml, 3/4 of 1/2, "
        "https://example.org/home/page, a ratio 12 / 100.\n"
    )
    (tmp_path / "picture.png").write_bytes(b"/work/main/not-text")
    assert absolute_paths(tmp_path) == [
        "report.md:1: /home/me/runs/x",
        "report.md:1: /tmp/r130/eval.json",
        "results/results.json:2: /work/main/configs/experiments/default.yaml",
        "results/results.json:3: C:\\\\Users\\\\me\\\\runs\\\\gram\\\\eval.json",
    ]
