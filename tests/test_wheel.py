"""latentloop as a user installs it: the sdist and the wheel built from this checkout, the wheel installed into
a fresh virtual environment, and the commands run from a folder outside the checkout.

The sdist is built first and the wheel from it, so the sdist is complete when the wheel is. The fresh
environment sees the test environment's installed packages (torch, numpy, ...) through a ``.pth`` file and
downloads nothing; the checkout's ``src`` is not importable there (no ``PYTHONPATH``, no editable install),
which the test checks before anything else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiments").glob("*.yaml"))
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
PRETRAINED = sorted(
    p.relative_to(ROOT / "src").as_posix()
    for p in (ROOT / "src" / "latentloop" / "resources" / "pretrained").rglob("*")
    if p.is_file()
)
# pyproject.toml's [project] version (tomllib is Python 3.11+; the project supports 3.10)
VERSION = re.search(r'(?m)^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
SUDOKU = ".1.26....3.....61...6...5....44....."  # the README's 6x6 puzzle for the shipped TRM
NQUEENS = "." * 16 + "Q" + "." * 47  # the README's 8x8 board for the shipped GRAM
# Tiny sizes for a few-second run of the default experiment (N-Queens 8x8, GRAM and TRM).
SMOKE = [
    "train.steps=2",
    "train.batch_size=8",
    "train.eval_size=0",
    "train.checkpoint_every=0",
    "train.train_size=16",
    "train.test_size=4",
    "model.dim=16",
    "model.hidden=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.n_sup=2",
    "eval.samples=2",
    "eval.steps=2",
    "eval.limit=2",
]

pytestmark = pytest.mark.slow


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    return done


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _first_words(text: str) -> list[str]:
    return sorted(line.split()[0] for line in text.splitlines() if line.strip())


def _package_files(site: Path) -> set[str]:
    """The installed package's files, compiled caches (bytecode, numba's) aside."""
    return {
        p.relative_to(site).as_posix()
        for p in (site / "latentloop").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist built from a copy of the checkout, and the wheel built from the unpacked sdist."""
    tmp = tmp_path_factory.mktemp("build")
    source, dist = tmp / "source", tmp / "dist"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    )
    build_sdist = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    name = _ok(_run([sys.executable, "-c", build_sdist], cwd=source)).strip().splitlines()[-1]
    sdist = dist / name
    unpacked = tmp / "unpacked"
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    [sdist_root] = unpacked.iterdir()
    wheel_command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    _ok(_run([*wheel_command, "--disable-pip-version-check", "-q", "-w", dist, sdist_root], cwd=tmp))
    [wheel] = dist.glob("latentloop-*.whl")
    return {"sdist": sdist, "wheel": wheel, "tmp": tmp}


@pytest.fixture(scope="module")
def installed(built) -> dict[str, Path | dict[str, str]]:
    """A fresh virtual environment with the wheel installed (``--no-deps``), the test environment's packages
    visible to it, and a working folder outside the checkout."""
    tmp = built["tmp"]
    venv = tmp / "venv"
    _ok(_run([sys.executable, "-m", "venv", venv], cwd=tmp))
    python = venv / "bin" / "python"
    pip = [python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q"]
    _ok(_run([*pip, built["wheel"]], cwd=tmp))
    site = Path(_ok(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp)))
    site = Path(str(site).strip())
    # After the install, so that pip does not see the editable latentloop of the test environment.
    theirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (site / "test-environment.pth").write_text("\n".join(theirs) + "\n")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "LATENTLOOP_BENCHMARKS")
    }
    env.update(OMP_NUM_THREADS="1", MPLCONFIGDIR=str(tmp / "matplotlib"), VIRTUAL_ENV=str(venv))
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    work = tmp / "work"
    work.mkdir()
    return {"venv": venv, "site": site, "env": env, "work": work, "python": python}


def test_the_sdist_and_the_wheel_hold_everything_a_command_needs(built):
    with tarfile.open(built["sdist"]) as archive:
        in_sdist = {"/".join(name.split("/")[1:]) for name in archive.getnames()}
    with zipfile.ZipFile(built["wheel"]) as archive:
        in_wheel = set(archive.namelist())
    for name in EXPERIMENTS:
        assert f"src/latentloop/configs/experiments/{name}.yaml" in in_sdist
        assert f"latentloop/configs/experiments/{name}.yaml" in in_wheel
    assert {f"latentloop/configs/{name}" for name in CONFIGS} <= in_wheel
    assert {f"latentloop/benchmarks/{name}.py" for name in BENCHMARKS} <= in_wheel
    assert set(PRETRAINED) <= in_wheel
    assert not [n for n in in_wheel if "benchmarks/results" in n or n.endswith("benchmarks/README.md")]
    assert len(EXPERIMENTS) >= 9 and "default" in EXPERIMENTS and len(BENCHMARKS) >= 9


def test_the_installed_wheel_runs_outside_the_checkout(installed):
    venv, work, env, site = installed["venv"], installed["work"], installed["env"], installed["site"]
    where = "import importlib.metadata as m, latentloop; print(latentloop.__file__); "
    where += "print(m.distribution('latentloop').locate_file('latentloop/__init__.py')); print(latentloop.__version__)"
    module, metadata, version = _ok(_run([installed["python"], "-c", where], work, env)).split()
    assert Path(module).is_relative_to(venv) and Path(metadata).is_relative_to(venv), (module, metadata)
    assert version == VERSION
    before = _package_files(site)
    latentloop = venv / "bin" / "latentloop"

    assert _ok(_run([latentloop, "--version"], work, env)).strip() == f"latentloop {VERSION}"
    assert _first_words(_ok(_run([latentloop, "run", "--list"], work, env))) == EXPERIMENTS
    assert _first_words(_ok(_run([latentloop, "bench", "--list"], work, env))) == BENCHMARKS
    assert "--batch-size" in _ok(_run([latentloop, "bench", "reasoners", "--help"], work, env))

    # The main job, tiny: the shipped experiment and its run configs, written under the working folder.
    done = _run([latentloop, "run", *SMOKE, "--budget-minutes", "1"], work, env, timeout=300)
    _ok(done)
    out = work / "runs" / "default"
    assert "report: runs/default/report.md" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["file"] == "configs/experiments/default.yaml"
    assert {row["train"]["config"] for row in results["models"].values()} == {
        "../graph-coloring8-gram-fast.yaml",
        "../graph-coloring8-trm-fast.yaml",
    }
    written = (out / "results.json").read_text() + (out / "report.md").read_text()
    assert str(installed["venv"].parent) not in written and "site-packages" not in written

    # The shipped pretrained models.
    done = _run([latentloop, "solve", "sudoku", SUDOKU], work, env)
    answer = next(line for line in _ok(done).splitlines() if line.startswith("answer: ")).split()[1]
    assert "valid (the verifier accepts it)" in done.stdout
    assert (
        _ok(_run([latentloop, "check", "sudoku", SUDOKU, answer, "--n", "6"], work, env)).strip() == "valid"
    )
    done = _run([latentloop, "solve", "nqueens", NQUEENS, "--samples", "20", "--select", "value"], work, env)
    assert "valid (the verifier accepts it)" in _ok(done)

    assert _package_files(site) == before  # nothing was written into the installed package
    assert sorted(p.name for p in work.iterdir()) == ["runs"]
