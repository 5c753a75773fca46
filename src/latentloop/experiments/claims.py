"""The claims of the two papers (Huginn, GRAM) and their baselines, measured against the committed results.

The claims are data: ``claims.yaml`` beside this file holds each claim's text, the paper's figure, the results
file and fields it is measured by (:class:`Measure`), the templates that print them, and the conditions that
decide its status (:class:`Rule`). This module reads and evaluates it; the status rules are code, here.
:mod:`latentloop.experiments.results_page` writes the markdown that shows the claims.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CLAIMS_FILE = Path(__file__).with_name("claims.yaml")

REPRODUCED, PARTLY, NOT, NOT_TRIED = "reproduced", "partly", "not", "not tried"
STATUSES = (REPRODUCED, PARTLY, NOT, NOT_TRIED)

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_OP_TEXT = {">": ">", ">=": "≥", "<": "<", "<=": "≤"}
_CONDITION = re.compile(r"^(\w+) (>=|<=|>|<) ([\w.+-]+)(?: ([+-]) ([\d.]+))?$")
_REDUCES = ("one", "min", "max", "sum", "count")


@dataclass(frozen=True)
class Measure:
    """A number read from a results file.

    ``paths`` are field paths: keys separated by dots, ``*`` for every key of a mapping, ``[key=value]`` for the
    list items whose ``key`` equals ``value`` (``[a=1,b=2]``: both hold), ``[*]`` for every item and ``[N]``
    for an index; on a mapping, ``[key]`` reads a key that holds dots (``gate[0.5]``). With one path that
    matches one value, the value itself; otherwise ``reduce`` (``min``, ``max``, ``sum``, ``count``) combines
    them. Booleans read as 1 and 0. The value is multiplied by ``scale`` (100 for fractions shown as percent).
    ``source`` reads another file than the claim's.
    """

    paths: tuple[str, ...]
    scale: float = 1.0
    reduce: str = "one"
    source: str | None = None

    @classmethod
    def parse(cls, data: str | dict[str, Any]) -> Measure:
        """A measure from its YAML form: a path, or ``{path | paths, scale, reduce, source}``."""
        data = {"path": data} if isinstance(data, str) else dict(data)
        paths = (data.pop("path"),) if "path" in data else tuple(data.pop("paths"))
        measure = cls(paths, float(data.pop("scale", 1)), data.pop("reduce", "one"), data.pop("source", None))
        if data or measure.reduce not in _REDUCES:
            raise ValueError(f"measure {paths}: unknown keys {sorted(data)} or reduce {measure.reduce!r}")
        return measure


@dataclass(frozen=True)
class Condition:
    """``left OP right + offset``, where ``left`` names a measure and ``right`` is a measure's name or a number."""

    left: str
    op: str
    right: str | float
    offset: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Condition:
        """A condition from its YAML form: ``"a >= b + 5"``, ``"a > 90"``."""
        match = _CONDITION.match(text.strip())
        if match is None:
            raise ValueError(f"condition {text!r} is not 'NAME OP (NAME | NUMBER) [± NUMBER]'")
        left, op, right, sign, offset = match.groups()
        try:
            right_value: str | float = float(right)
        except ValueError:
            right_value = right
        return cls(left, op, right_value, float(offset or 0) * (-1 if sign == "-" else 1))

    def holds(self, values: dict[str, float | None]) -> bool:
        """Whether the condition holds; a missing value makes it false."""
        left = values.get(self.left)
        right = values.get(self.right) if isinstance(self.right, str) else self.right
        if left is None or right is None:
            return False
        return _OPS[self.op](left, right + self.offset)

    def text(self) -> str:
        """The condition as written in the dashboard's rules."""
        right = self.right if isinstance(self.right, str) else f"{self.right:g}"
        offset = f" {'+' if self.offset > 0 else '−'} {abs(self.offset):g}" if self.offset else ""
        return f"{self.left} {_OP_TEXT[self.op]} {right}{offset}"


@dataclass(frozen=True)
class Rule:
    """The status from the measured values: "reproduced" when every condition of ``reproduced`` holds; else
    "partly" when every condition of ``partly`` holds (when ``partly`` is empty: when any of ``reproduced``
    holds); else "not"."""

    reproduced: tuple[Condition, ...]
    partly: tuple[Condition, ...] = ()

    def status(self, values: dict[str, float | None]) -> str:
        """The status this rule gives ``values``."""
        if all(c.holds(values) for c in self.reproduced):
            return REPRODUCED
        if self.partly:
            return PARTLY if all(c.holds(values) for c in self.partly) else NOT
        return PARTLY if any(c.holds(values) for c in self.reproduced) else NOT

    def text(self) -> str:
        """The rule as written in the dashboard."""
        text = "reproduced if " + " and ".join(c.text() for c in self.reproduced)
        if self.partly:
            text += "; partly if " + " and ".join(c.text() for c in self.partly)
        elif len(self.reproduced) > 1:
            text += "; partly if some of these hold"
        return text


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, where latentloop measures it, and how its status is decided.

    ``figure`` and ``scale`` are ``str.format`` templates over the measures and the file's ``constants`` (a
    missing value prints as "-"; the format spec ``yesno`` prints a truth value as yes/no, ``sci`` a number as
    1.05e14). ``source`` is ``None`` for a claim not tried. ``section`` is the ``## `` heading of RESULTS.md it
    links to; ``command`` is used when that section has no ``Command:`` line (or there is no section).
    """

    id: str
    family: str
    text: str
    paper: str
    source: str | None = None
    measures: dict[str, Measure] = field(default_factory=dict)
    figure: str = ""
    scale: str = ""
    rule: Rule | None = None
    section: str | None = None
    command: str | None = None


@dataclass(frozen=True)
class ClaimResult:
    """A claim evaluated against the committed results."""

    claim: Claim
    values: dict[str, float | None]
    status: str
    figure: str
    scale: str


@dataclass(frozen=True)
class Catalog:
    """What ``claims.yaml`` holds: the families in their order (full names), the family of each RESULTS.md
    section, the constants the templates may name, and the claims."""

    families: tuple[str, ...]
    sections: dict[str, str]
    constants: dict[str, str]
    claims: tuple[Claim, ...]

    def claim(self, claim_id: str) -> Claim:
        """The claim named ``claim_id`` (KeyError when none is)."""
        return {c.id: c for c in self.claims}[claim_id]


_CLAIM_KEYS = set(Claim.__dataclass_fields__)


def load_catalog(path: str | Path = CLAIMS_FILE) -> Catalog:
    """The claims file at ``path``, checked: known keys, known families, unique ids, and a rule exactly for the
    claims with a results file."""
    data = yaml.safe_load(Path(path).read_text())
    families: dict[str, str] = data["families"]
    claims = []
    for entry in data["claims"]:
        unknown = set(entry) - _CLAIM_KEYS
        if unknown or entry["family"] not in families or ("source" in entry) != ("rule" in entry):
            raise ValueError(f"claim {entry.get('id')!r}: unknown keys {sorted(unknown)}, family or rule")
        rule = entry.get("rule") or {}
        conditions = [tuple(map(Condition.parse, rule.get(key, ()))) for key in ("reproduced", "partly")]
        claims.append(
            Claim(
                **{k: v for k, v in entry.items() if k not in ("family", "measures", "rule")},
                family=families[entry["family"]],
                measures={name: Measure.parse(m) for name, m in entry.get("measures", {}).items()},
                rule=Rule(*conditions) if rule else None,
            )
        )
    if len({c.id for c in claims}) != len(claims):
        raise ValueError("claim ids repeat")
    sections = {title: families[key] for title, key in data.get("sections", {}).items()}
    return Catalog(tuple(families.values()), sections, dict(data.get("constants", {})), tuple(claims))


CATALOG = load_catalog()
CLAIMS = CATALOG.claims
FAMILIES = CATALOG.families


class Value:
    """A measured value inside a template: "-" when missing; the specs ``yesno`` (a truth value) and ``sci``."""

    def __init__(self, value: float | None) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        if self.value is None:
            return "-"
        if spec == "yesno":
            return "yes" if self.value else "no"
        if spec == "sci":
            return f"{self.value:.2e}".replace("e+", "e")
        return format(self.value, spec)


_TOKEN = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


def resolve(data: Any, path: str) -> list[Any]:
    """Every value of ``data`` at ``path`` (see :class:`Measure` for the syntax); an empty list when none."""
    nodes = [data]
    for match in _TOKEN.finditer(path):
        selector, key = match.group(1), match.group(2)
        found: list[Any] = []
        for node in nodes:
            if key is not None:
                if isinstance(node, dict):
                    found.extend(node.values() if key == "*" else [node[key]] if key in node else [])
            elif isinstance(node, list):
                if selector == "*":
                    found.extend(node)
                elif "=" in selector:
                    wanted = [term.split("=", 1) for term in selector.split(",")]
                    found.extend(
                        item
                        for item in node
                        if isinstance(item, dict)
                        and all(value == "*" or str(item.get(name)) == value for name, value in wanted)
                    )
                elif -len(node) <= int(selector) < len(node):
                    found.append(node[int(selector)])
            elif isinstance(node, dict) and selector in node:
                found.append(node[selector])
        nodes = found
    return nodes


def measure_value(measure: Measure, data: Any) -> float | None:
    """The number ``measure`` reads from ``data``, or ``None`` when the file lacks it."""
    values = [v for path in measure.paths for v in resolve(data, path) if v is not None]
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    if measure.reduce == "count":
        return float(len(numbers))
    if not numbers:
        return None
    if measure.reduce == "one" and len(numbers) != 1:
        raise ValueError(f"{measure.paths} matches {len(numbers)} values; give a reduce")
    reduce = {"one": lambda n: n[0], "min": min, "max": max, "sum": sum}[measure.reduce]
    return reduce(numbers) * measure.scale


def fill(template: str, values: dict[str, float | None], catalog: Catalog = CATALOG) -> str:
    """``template`` with the measured ``values`` and the catalog's constants in place."""
    return template.format(**catalog.constants, **{name: Value(v) for name, v in values.items()})


def evaluate(claim: Claim, base: Path, cache: dict[Path, Any] | None = None) -> ClaimResult:
    """``claim`` measured in the files under ``base`` (the folder of RESULTS.md)."""
    cache = {} if cache is None else cache
    if claim.source is None or claim.rule is None:
        return ClaimResult(claim, {}, NOT_TRIED, "no results file", "")
    values: dict[str, float | None] = {}
    for name, measure in claim.measures.items():
        path = base / (measure.source or claim.source)
        if not path.is_file():
            return ClaimResult(
                claim, {}, NOT_TRIED, f"no results file ({measure.source or claim.source})", ""
            )
        if path not in cache:
            cache[path] = json.loads(path.read_text())
        values[name] = measure_value(measure, cache[path])
    return ClaimResult(
        claim, values, claim.rule.status(values), fill(claim.figure, values), fill(claim.scale, values)
    )


def statuses(base: Path, claims: Iterable[Claim] = CLAIMS) -> dict[str, str]:
    """Each claim's status against the results under ``base``, by claim id."""
    cache: dict[Path, Any] = {}
    return {claim.id: evaluate(claim, base, cache).status for claim in claims}
