"""Figures: matplotlib's pyplot on its file-only backend, and PNGs written atomically."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from latentloop.io import atomic_path


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend, which draws to files and never needs a display."""
    # Imported on the first figure: most commands draw none, and matplotlib takes a second to load.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def save_png(figure: Any, path: str | Path, **options: Any) -> None:
    """Write ``figure`` to ``path`` as a PNG atomically (``options`` go to ``savefig``), then close it."""
    with atomic_path(path) as temp:
        figure.savefig(temp, format="png", **options)
    pyplot().close(figure)
