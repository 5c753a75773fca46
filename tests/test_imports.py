"""The import graph of ``src/latentloop``, read from the source with :mod:`ast` (nothing is imported).

Two rules keep the package importable in any order and its dependencies visible at the top of each file:

- module-level imports between latentloop modules form no cycle (a cycle works only while every module of it
  happens to import the others' names late enough, and breaks when someone reorders an import);
- an import of a latentloop module inside a function needs a reason from :data:`ALLOWED_FUNCTION_IMPORTS`
  (such imports usually dodge a cycle, which the first rule forbids anyway).

Importing ``latentloop.a.b`` also runs ``latentloop/a/__init__.py`` and ``latentloop/__init__.py`` when they have
not run yet, so the graph has those edges too. Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "latentloop"

# (importing module, imported module) -> why a function-level import is right there. Each side matches that
# module and everything below it.
ALLOWED_FUNCTION_IMPORTS: dict[tuple[str, str], str] = {
    ("latentloop.cli", "latentloop"): "the CLI loads what a command needs only when that command runs, "
    "so `latentloop --help` and the light commands start without torch and the models",
}


@dataclass(frozen=True)
class Import:
    """One latentloop module that an import statement runs."""

    importer: str  # dotted name of the module holding the statement
    target: str  # dotted name of the module it runs
    path: Path
    line: int
    in_function: bool

    def where(self, root: Path = ROOT) -> str:
        """``path:line`` of the statement, relative to ``root`` when below it."""
        path = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        return f"{path}:{self.line}"


# Folders of the package that hold scripts, not modules: the benchmarks that ``latentloop bench`` runs as
# ``__main__``; nothing imports them, and they import whatever they measure.
SCRIPT_FOLDERS = ("benchmarks",)


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``package`` under ``src`` (the scripts of
    :data:`SCRIPT_FOLDERS` left out)."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if len(parts) > 2 and parts[1] in SCRIPT_FOLDERS:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _ancestors(module: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages that run before the module does."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it sits inside a function."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, in_function
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.orelse:  # the body only runs under a type checker
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), in_function)
            else:
                nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                yield from walk(child, nested)

    yield from walk(tree, False)


def _resolve(
    statement: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: dict[str, Path]
) -> list[str]:
    """The modules of ``modules`` that ``statement`` names (those it runs on the way are added later)."""
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names if alias.name in modules]
    if statement.level:
        # Relative to the importer's package: an __init__ is its own package, a module sits in its parent's.
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (statement.level - 1)]
        source = ".".join([*base, statement.module] if statement.module else base)
    else:
        source = statement.module or ""
    named = [f"{source}.{alias.name}" for alias in statement.names]
    submodules = [name for name in named if name in modules]
    # Names that are not submodules are attributes of ``source`` itself, which then has to run.
    needs_source = len(submodules) < len(named)
    return ([source] if needs_source and source in modules else []) + submodules


def find_imports(src: Path = SRC, package: str = PACKAGE) -> list[Import]:
    """Every (module, latentloop module it runs) pair of the package's import statements."""
    modules = module_files(src, package)
    found = []
    for importer, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        own = set(_ancestors(importer))  # these began to run before the importer did
        for statement, in_function in _statements(tree):
            targets: dict[str, None] = {}
            for target in _resolve(statement, importer, path.name == "__init__.py", modules):
                for ancestor in _ancestors(target):
                    if ancestor not in own and ancestor in modules:
                        targets[ancestor] = None
                targets[target] = None
            found += [
                Import(importer, target, path, statement.lineno, in_function)
                for target in targets
                if target != importer
            ]
    return found


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative, so deep graphs do not recurse)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _shortest_cycle(graph: dict[str, dict[str, Import]], start: str, within: set[str]) -> list[Import]:
    """The shortest cycle through ``start`` using only modules of ``within``, as its import edges."""
    came_from: dict[str, Import] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child, edge in sorted(graph.get(node, {}).items()):
            if child not in within:
                continue
            if child == start:
                path = [edge]
                while path[0].importer != start:
                    path.insert(0, came_from[path[0].importer])
                return path
            if child not in came_from:
                came_from[child] = edge
                queue.append(child)
    return []


def find_cycles(imports: Iterable[Import], in_functions: bool = False) -> list[list[Import]]:
    """Cycles of module-level imports (with ``in_functions``, of all imports): for each strongly connected
    group of modules, shortest cycles until every module of the group is on one."""
    graph: dict[str, dict[str, Import]] = {}
    for item in sorted(imports, key=lambda i: i.in_function):  # a module-level edge first, where both are
        if in_functions or not item.in_function:
            graph.setdefault(item.importer, {}).setdefault(item.target, item)
    cycles = []
    for component in _strongly_connected(graph):
        members, covered = set(component), set()
        for module in component:
            if len(component) > 1 and module not in covered:
                cycle = _shortest_cycle(graph, module, members)
                covered.update(edge.importer for edge in cycle)
                cycles.append(cycle)
    return cycles


def format_cycle(cycle: list[Import], root: Path = ROOT) -> str:
    """``a (a.py:3) -> b (b.py:7, in a function) -> a``: each module with where it imports the next."""
    steps = [
        f"{edge.importer} ({edge.where(root)}{', in a function' if edge.in_function else ''})"
        for edge in cycle
    ]
    return " -> ".join([*steps, cycle[0].importer])


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def unexplained_function_imports(
    imports: Iterable[Import], allowed: dict[tuple[str, str], str] = ALLOWED_FUNCTION_IMPORTS
) -> list[Import]:
    """Function-level imports of latentloop modules that no entry of ``allowed`` explains."""
    return [
        item
        for item in imports
        if item.in_function
        and not any(
            _matches(item.importer, source) and _matches(item.target, target) for source, target in allowed
        )
    ]


def format_function_imports(imports: Iterable[Import], root: Path = ROOT) -> str:
    """One line per import statement (``path:line  importer -> targets``), grouped by file."""
    by_statement: dict[tuple[str, Path, int], list[str]] = {}
    for item in imports:
        by_statement.setdefault((item.importer, item.path, item.line), []).append(item.target)
    lines = []
    for (importer, path, line), targets in sorted(
        by_statement.items(), key=lambda kv: (str(kv[0][1]), kv[0][2])
    ):
        where = Import(importer, "", path, line, True).where(root)
        lines.append(f"{where}  {importer} -> {', '.join(targets)}")
    return "\n".join(lines)


# The package itself ----------------------------------------------------------------------------------------------
def test_module_level_imports_form_no_cycle():
    cycles = find_cycles(find_imports())
    if cycles:
        lines = [f"{len(cycles)} import cycle(s) among module-level imports:", *map(format_cycle, cycles)]
        pytest.fail("\n".join(lines), pytrace=False)


def test_function_level_imports_of_latentloop_modules_have_a_reason():
    imports = find_imports()
    offending = unexplained_function_imports(imports)
    statements = {(item.path, item.line) for item in offending}
    # The cycles that those imports keep from running at import time: what moving them up has to untangle.
    dodged = [cycle for cycle in find_cycles(imports, in_functions=True) if any(e.in_function for e in cycle)]
    if offending:
        pytest.fail(
            f"{len(statements)} function-level import(s) of latentloop modules without a reason in "
            "ALLOWED_FUNCTION_IMPORTS (move each to the top of its module):\n"
            + format_function_imports(offending)
            + f"\n\n{len(dodged)} cycle(s) that they keep from running at import time:\n"
            + "\n".join(map(format_cycle, dodged)),
            pytrace=False,
        )


# The helpers, on tiny packages -----------------------------------------------------------------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_package_without_cycles_passes(tmp_path):
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\nfrom pkg.sub.c import X\n",
            "b.py": "import os\n\ndef late():\n    from pkg import a\n",
            "sub/__init__.py": "from .c import X\n",
            "sub/c.py": "from typing import TYPE_CHECKING\nfrom .. import b\nif TYPE_CHECKING:\n    from pkg import a\nX = 1\n",
        },
    )
    imports = find_imports(src, "pkg")
    assert find_cycles(imports) == []
    module_level = {(i.importer, i.target) for i in imports if not i.in_function}
    assert module_level == {
        ("pkg.a", "pkg.b"),
        ("pkg.a", "pkg.sub"),
        ("pkg.a", "pkg.sub.c"),
        ("pkg.sub", "pkg.sub.c"),
        ("pkg.sub.c", "pkg.b"),
    }
    # b's late import of a is what keeps these from being cycles; every module of the group is on one.
    dodged = [format_cycle(cycle, tmp_path) for cycle in find_cycles(imports, in_functions=True)]
    assert dodged == [
        "pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:4, in a function) -> pkg.a",
        "pkg.sub (pkg/sub/__init__.py:1) -> pkg.sub.c (pkg/sub/c.py:2) -> pkg.b (pkg/b.py:4, in a function) "
        "-> pkg.a (pkg/a.py:2) -> pkg.sub",
    ]
    [late] = unexplained_function_imports(imports, allowed={})
    assert (late.importer, late.target, late.where(tmp_path)) == ("pkg.b", "pkg.a", "pkg/b.py:4")
    assert unexplained_function_imports(imports, allowed={("pkg.b", "pkg"): "a reason"}) == []


def test_a_cycle_is_found_and_reported_with_its_lines(tmp_path):
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "import os\nfrom . import b\n",
            "b.py": "from .c import f\n",
            "c.py": "def f():\n    pass\n\nfrom pkg.a import os\n",
            "d.py": "from pkg import a\n",
        },
    )
    cycles = find_cycles(find_imports(src, "pkg"))
    assert [format_cycle(cycle, tmp_path) for cycle in cycles] == [
        "pkg.a (pkg/a.py:2) -> pkg.b (pkg/b.py:1) -> pkg.c (pkg/c.py:4) -> pkg.a"
    ]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    # pkg.x imports pkg.sub.y, which first runs pkg/sub/__init__.py, which imports pkg.x back.
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "x.py": "import pkg.sub.y\n",
            "sub/__init__.py": "from pkg.x import *\n",
            "sub/y.py": "",
        },
    )
    [cycle] = find_cycles(find_imports(src, "pkg"))
    assert format_cycle(cycle, tmp_path) == "pkg.sub (pkg/sub/__init__.py:1) -> pkg.x (pkg/x.py:1) -> pkg.sub"


# The layers of docs/ARCHITECTURE.md -------------------------------------------------------------------------------
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
_LAYER_ROW = re.compile(r"^\|\s*(\d+)\.[^|]*\|([^|]*)\|")


def read_layers(text: str) -> dict[str, int]:
    """The layer table of ARCHITECTURE.md: each module named in a row's second column (in backticks, dotted
    and relative to the package: ``eval.metrics``, ``nn``) -> the row's layer number."""
    layers = {}
    for line in text.splitlines():
        row = _LAYER_ROW.match(line)
        if row:
            for name in re.findall(r"`([^`]+)`", row.group(2)):
                layers[name] = int(row.group(1))
    return layers


def layer_of(module: str, layers: dict[str, int], package: str = PACKAGE) -> int | None:
    """The layer of the most specific table entry that holds ``module`` (an entry holds its submodules). A
    package whose members sit in different layers is as low as its lowest member: importing any member runs
    the package's ``__init__`` first, so that ``__init__`` may import nothing above that member."""
    relative = module.removeprefix(package).removeprefix(".")
    holding = [name for name in layers if _matches(relative, name)]
    found = [layers[max(holding, key=len)]] if holding else []
    found += [layer for name, layer in layers.items() if name.startswith(relative + ".")]
    return min(found) if found else None


def layer_violations(imports: Iterable[Import], layers: dict[str, int], package: str = PACKAGE) -> list[str]:
    """Every import whose target sits in a higher layer than its importer, as ``where: a (N) -> b (M)``."""
    found = []
    for item in imports:
        own, target = layer_of(item.importer, layers, package), layer_of(item.target, layers, package)
        if own is not None and target is not None and target > own:
            found.append(f"{item.where()}: {item.importer} ({own}) -> {item.target} ({target})")
    return sorted(set(found))


def test_every_module_has_a_layer_and_every_named_module_exists():
    layers = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    modules = [name for name in module_files(SRC, PACKAGE) if name != PACKAGE]  # the root holds the version
    assert [name for name in modules if layer_of(name, layers) is None] == []
    relative = [name.removeprefix(PACKAGE + ".") for name in modules]
    assert [name for name in layers if not any(_matches(module, name) for module in relative)] == []


def test_no_module_imports_from_a_layer_above_its_own():
    layers = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    violations = layer_violations(find_imports(), layers)
    assert not violations, "imports against the layer table of docs/ARCHITECTURE.md:\n" + "\n".join(
        violations
    )


def test_the_layer_check_finds_an_upward_import(tmp_path):
    src = _package(tmp_path, {"__init__.py": "", "low.py": "from pkg.high import x\n", "high.py": "x = 1\n"})
    layers = read_layers("| layer | modules |\n|---|---|\n| 0. base | `low` |\n| 1. top | `high` |\n")
    assert layers == {"low": 0, "high": 1}
    [violation] = layer_violations(find_imports(src, "pkg"), layers, "pkg")
    assert violation.endswith("pkg.low (0) -> pkg.high (1)")
    assert layer_violations(find_imports(src, "pkg"), {"low": 1, "high": 1}, "pkg") == []
    # A package is as low as its lowest member, since importing that member runs the package first.
    assert layer_of("pkg.sub", {"sub": 5, "sub.leaf": 3}, "pkg") == 3
    assert layer_of("pkg.sub.other", {"sub": 5, "sub.leaf": 3}, "pkg") == 5


# Imports inside functions -----------------------------------------------------------------------------------------
# (module, imported top-level name) -> why it is imported inside a function there. Outside the command line only a
# dependency that is optional, or costly and needed by one rare path, is.
LATE_IMPORTS: dict[tuple[str, str], str] = {
    ("latentloop.plotting", "matplotlib"): "matplotlib and its backend load on the first figure only; most "
    "commands draw none",
    ("latentloop.train.monitor", "torch"): "tensorboard is optional: torch.utils.tensorboard needs the "
    "tensorboard package, which only train.tensorboard=true asks for",
    ("latentloop.train.precision", "torch"): "torch._inductor's C++ builder loads the compiler stack, about "
    "a second, which only train.compile needs",
}
MAX_LATE_IMPORTS = 10


def late_imports(src: Path = SRC, package: str = PACKAGE) -> list[tuple[str, str, str]]:
    """``(module, imported top-level name, path:line)`` of every import statement inside a function, outside the
    command line (``cli/``), benchmark scripts included."""
    found = []
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[1:2] == ["cli"]:
            continue
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for statement, in_function in _statements(ast.parse(path.read_text(encoding="utf-8"))):
            if in_function:
                if isinstance(statement, ast.Import):
                    names = [alias.name for alias in statement.names]
                else:
                    names = ["." if statement.level else statement.module or ""]
                where = f"{path.relative_to(src.parent)}:{statement.lineno}"
                found += [(module, name.split(".")[0], where) for name in names]
    return found


def test_imports_inside_functions_are_few_and_each_has_a_reason():
    found = late_imports()
    unexplained = [f"{where}: {name}" for module, name, where in found if (module, name) not in LATE_IMPORTS]
    assert not unexplained, "imports inside functions without a reason in LATE_IMPORTS:\n" + "\n".join(
        unexplained
    )
    assert len(found) <= MAX_LATE_IMPORTS, (
        f"{len(found)} imports inside functions, at most {MAX_LATE_IMPORTS}"
    )
    stale = set(LATE_IMPORTS) - {(module, name) for module, name, _ in found}
    assert not stale, f"reasons in LATE_IMPORTS for imports that are gone: {sorted(stale)}"
