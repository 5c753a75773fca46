"""Atomic writes and the JSON reports of the benchmarks."""

from __future__ import annotations

import json

from latentloop.io import emit_json_report


def test_a_json_report_is_printed_and_written_alike(tmp_path, capsys):
    out = tmp_path / "nested" / "report.json"
    emit_json_report({"speedup": 1.5, "models": ["gram"]}, out, indent=2)
    printed = capsys.readouterr().out
    assert out.read_text() == printed and json.loads(printed) == {"speedup": 1.5, "models": ["gram"]}
    assert [p.name for p in out.parent.iterdir()] == ["report.json"]  # no temporary file left
