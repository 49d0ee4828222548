"""The scale night (nightly/scale.yaml) under pytest: each of its cells, 64 real gloo ranks on
namespaces scaled by `--ranks` (docs/scale.md), run with `chaos run` as the night runs it.
What a cell must show is its scenario's expect block, its bounds stretched by the same rule
(control: no fault, no rank left, no suspicion; elastic_kill: the world less the killed rank,
every survivor detecting the kill): exit 0, and nothing left on the host.

Nightly: minutes each, and a slow hour of the VM stops every rank at once (0.41-0.59 s of
silence, docs/scale-journal.md), which can fail the stretched bounds. CI checks the plan's
cells without running them (tests/scale/test_nightly_plan.py)."""
from __future__ import annotations

import shlex

import pytest

from harness.studies.nightly import PLANS, expand, load_night_plan
from tests.conftest import chaos_cli

pytestmark = [pytest.mark.requires_root, pytest.mark.nightly]
PLAN = PLANS / "scale.yaml"


@pytest.mark.parametrize("cell", expand(load_night_plan(PLAN), PLAN),
                         ids=lambda cell: f"{cell.scenario.name}-{'+'.join(cell.policies)}")
def test_a_cell_of_the_scale_night(cell, tmp_path, leaves_nothing):
    policies = [word for policy in cell.policies for word in ("--policy", policy)]
    done = chaos_cli(*shlex.split(cell.command)[1:], *policies, "--out", str(tmp_path), "--quiet", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
