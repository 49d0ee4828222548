"""The nightly plan of the 64-rank jobs (nightly/scale.yaml) expands into scaled cells."""
from __future__ import annotations

from harness.run.nightly import PLANS, expand, load_night_plan
from harness.run.scenario import load_scenario, scaled_to_cores
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
