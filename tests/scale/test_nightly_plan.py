"""The nightly plan of the 64-rank jobs (nightly/scale.yaml) expands into scaled cells."""
from __future__ import annotations

import re

from harness.run.nightly import PLANS, expand, load_night_plan
from harness.run.scenario import load_scenario
from harness.run.scaling import scaled_to_cores
from tests.conftest import REPO

PLAN = PLANS / "scale.yaml"


def test_scale_plan_runs_64_ranks_scaled_like_chaos_run():
    cells = expand(load_night_plan(PLAN), PLAN)
    assert [(c.scenario.name, c.policies) for c in cells] == [("control", ("timeout",)),
                                                                ("elastic_kill", ("elastic",))]
    for cell in cells:
        assert cell.scenario.cluster.ranks == 64
        assert "--ranks 64" in cell.command
        unscaled = load_scenario(REPO / "scenarios" / f"{cell.scenario.name}.yaml",
                                 {"cluster.ranks": 64, "seed": cell.scenario.seed})
        assert cell.scenario == scaled_to_cores(unscaled)


def test_every_scenario_trial_ci_leaves_out_is_run_by_a_night():
    """.ci/run deselects long scenario trials on the grounds that the nights run them."""
    deselected = re.findall(r"--deselect scenarios/(\w+)\.yaml::(\w+)", (REPO / ".ci" / "run").read_text())
    assert deselected, "no scenario trial deselected: this test no longer checks anything"
    nightly = {(c.scenario.name, p) for plan in PLANS.glob("*.yaml")
               for c in expand(load_night_plan(plan), plan) for p in c.policies}
    assert [d for d in deselected if d not in nightly] == []
