"""`chaos schema` and `chaos run FILE --dry-run` only read a scenario: they must answer
without importing torch, pandas or matplotlib (seconds and hundreds of MB at start-up;
bench/cli_startup.py prints the time and memory they take)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

HEAVY = ("torch", "pandas", "matplotlib")


def imported_by(*args: str) -> tuple[str, set[str]]:
    """The command's stdout and the top-level packages it imported (from -X importtime)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")]
    return done.stdout, {fields[-1].strip().split(".")[0] for fields in lines if len(fields) == 3}


@pytest.mark.parametrize("args", [("schema",), ("run", "scenarios/link_down.yaml", "--dry-run")],
                         ids=["schema", "dry-run"])
def test_reading_a_scenario_imports_no_torch_pandas_or_matplotlib(args):
    out, packages = imported_by(*args)
    assert "harness" in packages and "pydantic" in packages  # the probe sees the imports
    assert sorted(packages & set(HEAVY)) == []
    if args == ("schema",):
        assert json.loads(out)["title"] == "chaos-harness scenario"
    else:
        assert "apply   faults.0 link_down" in out and "timeout    timeout 5 s" in out
