"""A pytest plugin for tests/scale/test_nightly_plan.py (`-p tests.scale.night_items
--night-items FILE`): what the session collected, as JSON in FILE, one object per item: a
scenario trial's file and trial, a Python test's night cell (its parameter `cell`, a cell of a
night's plan) or none."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--night-items", metavar="FILE", required=True, help="where to write the collected items")


def pytest_collection_finish(session: pytest.Session) -> None:
    from harness.pytest_plugin import ScenarioTest
    from harness.studies.nightly.plan import Cell
    items = []
    for item in session.items:
        if isinstance(item, ScenarioTest):
            items.append({"id": item.nodeid, "scenario": str(item.path), "trial": item.name})
            continue
        callspec = getattr(item, "callspec", None)
        cell = callspec.params.get("cell") if callspec else None
        items.append({"id": item.nodeid, "cell": [str(cell.scenario_file), list(cell.policies),
                                                  cell.scenario.cluster.ranks] if isinstance(cell, Cell) else None})
    Path(session.config.getoption("night_items")).write_text(json.dumps(items))
