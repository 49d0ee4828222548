"""The nights' plans against the nightly tier: every test CI leaves to the nights (a
scenario's `tier:`, a Python test's nightly marker) is a cell of some night's plan
(nightly/*.yaml), and every cell of a night is a trial of its scenario; the 64-rank jobs'
plan (nightly/scale.yaml) expands into scaled cells."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.scenario.scaling import scaled_to_cores
from harness.scenario.scenario import load_scenario
from harness.studies.nightly import PLANS, expand, load_night_plan
from harness.studies.nightly.plan import Cell
from tests.conftest import REPO, REQUIRE

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


def night_cells() -> list[Cell]:
    """Every trial cell of every night's plan (a campaign is not a trial's run)."""
    return [cell for plan in sorted(PLANS.glob("*.yaml")) for cell in expand(load_night_plan(plan), plan)
            if isinstance(cell, Cell)]


def nightly_items(tmp_path: Path) -> list[dict]:
    """The nightly tier as pytest collects it from the repository's test paths, as CI would
    (tests/scale/night_items.py says what each item is); CHAOS_REQUIRE left out: the tiers
    are checked here, not this machine."""
    found = tmp_path / "items.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.scale.night_items", "--night-items", str(found), "-m", "nightly"],
                          cwd=REPO, env={k: v for k, v in os.environ.items() if k != REQUIRE},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(found.read_text())


def test_every_test_ci_leaves_to_the_nights_is_a_cell_of_a_night(tmp_path):
    items = nightly_items(tmp_path)
    assert any("scenario" in item for item in items) and any("cell" in item for item in items), (
        "no scenario trial or no Python test is nightly: this test no longer checks one of them")
    cells = night_cells()
    trials = {(Path(cell.scenario_file).resolve(), policy) for cell in cells for policy in cell.policies}
    runs = {(Path(cell.scenario_file).resolve(), tuple(cell.policies), cell.scenario.cluster.ranks) for cell in cells}
    in_no_night = [item["id"] for item in items
                   if ((Path(item["scenario"]).resolve(), item["trial"]) not in trials if "scenario" in item
                       else item["cell"] is None or (Path(item["cell"][0]).resolve(), tuple(item["cell"][1]),
                                                     item["cell"][2]) not in runs)]
    assert not in_no_night, (
        f"nightly, so CI leaves them out, and no night runs them: {', '.join(in_no_night)}; add each trial to a "
        "plan under nightly/ or give it tier ci; a Python test is a night's when its parameter `cell` is a cell "
        "of a plan (tests/scale/test_64_ranks.py)")


def test_every_cell_of_a_night_is_a_trial_of_its_scenario():
    for cell in night_cells():
        trials = load_scenario(cell.scenario_file).trial_names()
        assert set(cell.policies) <= set(trials), (cell.scenario_file, cell.policies, trials)
