"""Where in a YAML file a problem is: the line of a field, the keys given twice, a
validation error's location in the model turned into its place in the file, with the
accepted form. Scenario and plan files both report through it ("file:line: field: problem").
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from chaos import units
from chaos.faults import kind_names

TARGET_FORM = 'give a target: rank: 5, ranks: [1, 2], group: NAME, count: 2 or count: "25%"'
_MISSING_FORMS = {"target": TARGET_FORM, "on_for": units.DURATION_FORM, "off_for": units.DURATION_FORM,
                  "percent": units.PERCENT_FORM, "rate": units.RATE_FORM,
                  "duration": f"this kind spins for a set time: {units.DURATION_FORM}"}
_PATH_PREFIX = re.compile(r"^((?:[A-Za-z_]\w*|\d+)(?:\.(?:[A-Za-z_]\w*|\d+))*): ")


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the YAML node at location `loc`, as deep as it exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value
                         if isinstance(k, yaml.ScalarNode) and k.value == str(key)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def duplicate_keys(node: yaml.Node | None, path: Path, seen: set[int] | None = None) -> list[str]:
    """Every key given twice in one mapping (YAML would silently keep the last), both lines."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: its node was checked where it was defined
        return []
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        return [p for item in node.value for p in duplicate_keys(item, path, seen)]
    if not isinstance(node, yaml.MappingNode):
        return []
    problems, first = [], {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            line = key.start_mark.line + 1
            if key.value in first:
                problems.append(f"{path}:{line}: {key.value}: given twice (first on line {first[key.value]}); "
                                "keep one")
            first.setdefault(key.value, line)
        problems += duplicate_keys(value, path, seen)
    return problems


def _file_location(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic location in the model -> the same place in the file, where a fault's
    parameters sit flat beside its timing: ("faults", 0, "fault", "loss", "percent") ->
    ("faults", 0, "percent"); a mapping's key is where its entry is."""
    loc = tuple(p for p in loc if not str(p).startswith("function-") and p != "[key]")
    if len(loc) >= 3 and loc[0] == "faults" and loc[2] == "fault":
        rest = loc[3:]
        if rest and rest[0] in kind_names():
            rest = rest[1:]  # the tag of the fault union repeats the kind
        loc = loc[:2] + rest
    if len(loc) >= 4 and loc[0] == "faults" and loc[2] == "start" and loc[3] in ("event", "seconds"):
        loc = loc[:3] + loc[4:]  # the tag of start's two forms (harness.scenario.scenario.Start)
    return loc


def describe_errors(exc: ValidationError) -> list[tuple[tuple[Any, ...], str]]:
    """(location in the file, "field: problem (got value)") for every problem."""
    problems = []
    for err in exc.errors():
        loc = _file_location(tuple(err["loc"]))
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        # a model-level check names its field itself: "faults.1.target.rank: ..."
        named = _PATH_PREFIX.match(msg)
        if named:
            loc += tuple(int(p) if p.isdigit() else p for p in named.group(1).split("."))
            msg = msg[named.end():]
        value = err.get("input")
        if err["type"] == "missing":
            msg = f"missing; {_MISSING_FORMS.get(str(loc[-1]), 'this field is required')}"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling (`chaos schema` lists the fields)"
        elif err["type"] != "missing" and not named and repr(value) not in msg and not isinstance(value, dict):
            msg += f" (got {value!r})"
        field = ".".join(str(p) for p in loc) or "scenario"
        problems.append((loc, f"{field}: {msg}"))
    return problems


def file_line(path: Path, loc: tuple[Any, ...]) -> str:
    """"path:line" of location `loc` in a scenario file that loaded (for a problem found
    later, when the run is placed); the path alone where the file cannot be read again."""
    try:
        line = line_of(yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader), loc)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        line = None
    return f"{path}:{line}" if line else str(path)
