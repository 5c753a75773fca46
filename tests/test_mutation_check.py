"""The mutation check (scripts/mutation_check.py): its fault list fits the current source, and every planted
fault is caught by the tests named to cover it."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mutation_check.py"


def load_script() -> ModuleType:
    """The script as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("mutation_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


check = load_script()


@pytest.mark.parametrize("fault", check.FAULTS, ids=lambda f: f.name)
def test_each_fault_edits_text_found_exactly_once_in_the_source(fault) -> None:
    text = check.source_file(fault).read_text(encoding="utf-8")
    assert text.count(fault.old) == 1, f"{fault.name}: update its old text to the current {fault.path}"
    mutated = check.mutated_text(fault)
    assert mutated != text and fault.new in mutated


def test_fault_names_are_unique_and_name_existing_tests() -> None:
    names = [f.name for f in check.FAULTS]
    assert len(names) == len(set(names))
    check.validate(check.FAULTS)
    for fault in check.FAULTS:
        assert fault.tests and all(t.startswith("tests/") for t in fault.tests), fault.name


def test_a_fault_that_no_longer_fits_the_source_is_refused(capsys) -> None:
    fault = check.FAULTS[0]
    for broken in (
        dataclasses.replace(fault, old="this text is nowhere in the source"),
        dataclasses.replace(fault, old="\n"),  # everywhere
        dataclasses.replace(fault, new="for key in (rows, cols:"),  # not Python
        dataclasses.replace(fault, path="no/such/module.py"),
    ):
        with pytest.raises(check.ListError):
            check.mutated_text(broken)
    twice = (fault, dataclasses.replace(fault, tests=("tests/no_such_file.py",)))
    with pytest.raises(check.ListError, match="used twice"):
        check.validate(twice)
    with pytest.raises(check.ListError, match="does not exist"):
        check.validate((twice[1],))
    assert check.main(["--only", "no-such-fault"]) == 2
    assert "unknown fault" in capsys.readouterr().err


def test_list_names_every_fault_and_its_tests(capsys) -> None:
    assert check.main(["--list"]) == 0
    out = capsys.readouterr().out
    for fault in check.FAULTS:
        assert fault.name in out and all(t in out for t in fault.tests)


@pytest.mark.slow
def test_a_harmless_edit_survives_and_a_red_baseline_stops_the_check(monkeypatch, capsys) -> None:
    fault = check.FAULTS[0]
    harmless = dataclasses.replace(fault, name="harmless", new=f"{fault.old}  # a comment")
    monkeypatch.setattr(check, "FAULTS", (harmless,))
    assert check.main([]) == 1
    out = capsys.readouterr().out
    assert "harmless" in out and "SURVIVED" in out
    missing = dataclasses.replace(fault, tests=(f"{fault.tests[0].split('::')[0]}::no_such_test",))
    monkeypatch.setattr(check, "FAULTS", (missing,))
    assert check.main([]) == 2
    assert "unmodified source fails" in capsys.readouterr().out


@pytest.mark.slow
def test_every_planted_fault_is_caught() -> None:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stdout + done.stderr
    for fault in check.FAULTS:
        assert any(line.split()[:2] == [fault.name, "caught"] for line in done.stdout.splitlines()), (
            fault.name
        )
    assert seconds < 480, f"the mutation check took {seconds:.0f}s; keep its covering tests small"
