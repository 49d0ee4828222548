"""The timeline the orchestrator runs and the plan `chaos run --dry-run` prints."""
from __future__ import annotations

from pathlib import Path

from harness.run.orchestrator import Action, plan_text, timeline
from harness.run.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def scenario_of(tmp_path: Path, faults: str):
    path = tmp_path / "s.yaml"
    path.write_text(f"cluster: {{ranks: 8}}\nseed: 3\nfaults:\n{faults}"
                    "policies: {timeout: {timeout: 5s}}\nexpect: {timeout: {outcome: failed-fast}}\n")
    return load_scenario(path), path


def test_pulses_become_apply_revert_pairs_in_time_order(tmp_path: Path) -> None:
    scenario, _ = scenario_of(tmp_path, "  - {kind: link_down, target: {rank: 1}, start: 1s, duration: 7s,"
                                        " pulses: {on_for: 1s, off_for: 2s}}\n"
                                        "  - {kind: pause, target: {rank: 2}, start: 2s, duration: 2s}\n"
                                        "  - {kind: kill, target: {rank: 3}, start: 9s}\n")
    assert timeline(scenario) == [
        Action(1.0, "apply", 0), Action(2.0, "revert", 0), Action(2.0, "apply", 1),
        Action(4.0, "revert", 1), Action(4.0, "apply", 0), Action(5.0, "revert", 0),
        Action(7.0, "apply", 0), Action(8.0, "revert", 0), Action(9.0, "apply", 2)]


def test_the_plan_names_ranks_mechanism_and_times(tmp_path: Path) -> None:
    scenario, path = scenario_of(tmp_path, "  - {kind: loss, percent: '20%', target: {count: 2},"
                                           " start: 1s, duration: 4s}\n")
    plan = plan_text(scenario, path, ["timeout"], lambda fault: f"mechanism-for-{fault.kind}")
    ranks = ",".join(map(str, scenario.targets(0)))
    assert "+  1.000 s  apply   faults.0 loss(" in plan
    assert f"on ranks {ranks} by mechanism-for-loss" in plan
    assert f"+  5.000 s  revert  faults.0 loss on ranks {ranks}" in plan
    assert "timeout    timeout 5 s, 0 retries" in plan and "expects outcome failed-fast" in plan


def test_every_shipped_scenario_has_a_plan() -> None:
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = load_scenario(path)
        plan = plan_text(scenario, path, list(scenario.policies), lambda fault: "m")
        assert scenario.name in plan and (not scenario.faults or " apply " in plan)
