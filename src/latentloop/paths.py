"""Where the files that ship inside the package lie, and how paths are written into reports.

The run configs (``configs/*.yaml``), the experiments (``configs/experiments/*.yaml``), the benchmark scripts
(``benchmarks/*.py``) and the pretrained models (``resources/pretrained/``) are package data: they are found
beside this module, so every command works the same from an installed wheel as from a source checkout. In a
checkout, the repository's ``configs`` and ``benchmarks`` are links to these folders, so the documented paths
(``--config configs/nqueens8-gram.yaml``) work there too, and an editable install (``scripts/setup.sh``) runs
the checkout's own files.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIGS_DIR = PACKAGE_DIR / "configs"
EXPERIMENTS_DIR = CONFIGS_DIR / "experiments"
BENCHMARKS_DIR = PACKAGE_DIR / "benchmarks"
PRETRAINED_DIR = PACKAGE_DIR / "resources" / "pretrained"


def relative_path(path: str | Path, start: str | Path) -> str:
    """``path`` relative to the folder ``start`` (``..`` where it lies outside), as written into a report;
    a relative ``path`` is taken relative to the working directory. Its own text where no relative form
    exists (another drive on Windows)."""
    try:
        return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()
    except ValueError:
        return str(path)


def shipped_or_relative(path: str | Path) -> str:
    """A file as written into a report: ``configs/...`` for one that ships in the package (the same path in a
    source checkout), else relative to the working directory (:func:`relative_path`)."""
    resolved = Path(path).resolve()
    if resolved.is_relative_to(PACKAGE_DIR):
        return resolved.relative_to(PACKAGE_DIR).as_posix()
    return relative_path(resolved, Path.cwd())
