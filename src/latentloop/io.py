"""Atomic file writes: a file is complete or absent, never half written."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from latentloop.errors import UsageError


@contextlib.contextmanager
def writing_to(path: str | Path) -> Iterator[None]:
    """Report an ``OSError`` raised inside (a folder that cannot be made, a read-only place) as bad input that
    names ``path``, the place the user asked for, rather than the temporary file beside it."""
    try:
        yield
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is flushed and renamed onto ``path``."""
    path = Path(path)
    with writing_to(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    temp = Path(temp_name)
    try:
        yield temp
        with open(temp, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as temp:
        temp.write_text(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as temp:
        temp.write_bytes(data)


def emit_json_report(report: object, output: str | Path | None, indent: int = 1) -> None:
    """Print ``report`` as JSON and, when ``output`` is given, write the same text there atomically."""
    text = json.dumps(report, indent=indent)
    print(text)
    if output:
        atomic_write_text(output, text + "\n")
