"""Property: whatever a hand edit or a corruption does to a shipped scenario file, the loader
either returns a scenario or raises UsageError (file:line: field: problem); never anything
else."""
from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.errors import UsageError
from harness.scenario.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SHIPPED = {p.name: p.read_text() for p in sorted(SCENARIOS.glob("*.yaml"))}
FIELD_NAMES = ["kind", "target", "rank", "ranks", "count", "group", "start", "duration", "pulses", "on_for",
               "off_for", "percent", "latency", "rate", "timeout", "outcome", "detect_within", "ranks", "seed"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["250ms", "20%", "10mbit", "-1s", "1e309s", "0s", "25%", "SIGKILL",
                                           "hung", "failed-fast", "100%", "0%", "nan", "inf", "1h"]),
    st.dates(), st.just(datetime.datetime(2020, 1, 1)))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=6),
                                                          st.integers(), st.booleans()), inner, max_size=4)),
    max_leaves=8)


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in the tree a mutation can hit."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += paths(value, prefix + (i,))
    return found


def mutate(tree: Any, data: st.DataObject) -> Any:
    tree = copy.deepcopy(tree)
    where = data.draw(st.sampled_from(paths(tree)))
    if not where:
        return data.draw(values)
    parent = tree
    for key in where[:-1]:
        parent = parent[key]
    leaf = where[-1]
    action = data.draw(st.sampled_from(["replace", "delete", "rename", "add", "wrap", "duplicate"]))
    if action == "replace":
        parent[leaf] = data.draw(values)
    elif action == "delete":
        del parent[leaf]
    elif action == "rename" and isinstance(parent, dict):
        parent[data.draw(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=6)))] = parent.pop(leaf)
    elif action == "add" and isinstance(parent[leaf], dict):
        parent[leaf][data.draw(st.sampled_from(FIELD_NAMES))] = data.draw(values)
    elif action == "wrap":
        parent[leaf] = [parent[leaf]]
    elif action == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[leaf]))
    return tree


def loads_or_says_why(path: Path) -> None:
    try:
        load_scenario(path)
    except UsageError as exc:
        assert str(exc).startswith(str(path)), str(exc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(SHIPPED)), data=st.data())
def test_mutated_fields_load_or_raise_usage_error(tmp_path_factory: Any, name: str, data: st.DataObject) -> None:
    tree = yaml.safe_load(SHIPPED[name])
    for _ in range(data.draw(st.integers(1, 3))):
        tree = mutate(tree, data)
    path = tmp_path_factory.mktemp("mut") / name
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    loads_or_says_why(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(SHIPPED)), data=st.data())
def test_corrupted_text_loads_or_raises_usage_error(tmp_path_factory: Any, name: str, data: st.DataObject) -> None:
    raw = bytearray(SHIPPED[name].encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        cut = data.draw(st.integers(0, 8))
        raw[at:at + cut] = data.draw(st.one_of(st.binary(max_size=6), st.sampled_from(
            [b":", b"-", b"\n", b"  ", b"{", b"]", b"&a", b"*a", b"!!python/object", b"\t", b"'", b"#"])))
    path = tmp_path_factory.mktemp("raw") / name
    path.write_bytes(bytes(raw))
    loads_or_says_why(path)
