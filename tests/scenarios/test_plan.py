"""The plan of a trial, built once from a scenario and a policy, and the text `chaos run
--dry-run` prints from it."""
from __future__ import annotations

from pathlib import Path

from harness.scenario.scenario import load_scenario
from harness.trial.plan import build_plan, plan_text, trial_deadline_s
from runfolder.plan import Action, Expectation

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def scenario_of(tmp_path: Path, faults: str):
    path = tmp_path / "s.yaml"
    path.write_text(f"cluster: {{ranks: 8}}\nseed: 3\nwarmup_steps: 5\nsettle_steps: 6\nhang_cap: 40s\n"
                    f"faults:\n{faults}"
                    "policies: {timeout: {timeout: 5s}, retry: {}}\n"
                    "expect: {timeout: {outcome: failed-fast, detect_within: 7s}}\n")
    return load_scenario(path), path


def test_pulses_become_apply_revert_pairs_in_time_order(tmp_path: Path) -> None:
    scenario, _ = scenario_of(tmp_path, "  - {kind: link_down, target: {rank: 1}, start: 1s, duration: 7s,"
                                        " pulses: {on_for: 1s, off_for: 2s}}\n"
                                        "  - {kind: pause, target: {rank: 2}, start: 2s, duration: 2s}\n"
                                        "  - {kind: kill, target: {rank: 3}, start: 9s}\n")
    assert build_plan(scenario, "timeout").trial.actions == (
        Action(1.0, "apply", 0), Action(2.0, "revert", 0), Action(2.0, "apply", 1),
        Action(4.0, "revert", 1), Action(4.0, "apply", 0), Action(5.0, "revert", 0),
        Action(7.0, "apply", 0), Action(8.0, "revert", 0), Action(9.0, "apply", 2))


def test_the_plan_holds_targets_policy_expectation_and_caps(tmp_path: Path) -> None:
    scenario, _ = scenario_of(tmp_path, "  - {kind: loss, percent: '20%', target: {count: 2},"
                                        " start: 1s, duration: 4s}\n")
    built = build_plan(scenario, "timeout")
    plan = built.trial
    [fault] = plan.faults
    assert fault.targets == scenario.targets(0) and len(fault.targets) == 2
    assert (fault.kind, fault.start, fault.duration) == ("loss", 1.0, 4.0)
    assert fault.fault == scenario.faults[0].fault.model_dump(mode="json")
    assert built.faults == (scenario.faults[0].fault,)
    assert plan.expect == Expectation(outcome=("failed-fast",), detect_within=7.0)
    assert (plan.policy, plan.policy_spec["timeout"], plan.policy_spec["max_retries"]) == ("timeout", 5.0, 0)
    assert (plan.ranks, plan.seed, plan.warmup_steps, plan.settle_steps, plan.hang_cap) == (8, 3, 5, 6, 40.0)
    assert plan.workload["step_period"] == 0.25 and plan.last_action_s == 5.0
    assert build_plan(scenario, "retry").trial.expect is None


def test_the_rank_counts_a_scenario_expects_reach_the_plan_and_its_text() -> None:
    path = SCENARIOS / "elastic_kill.yaml"
    scenario = load_scenario(path)
    expect = build_plan(scenario, "elastic").trial.expect
    assert expect is not None and (expect.ranks_lost_at_most, expect.undetected_at_most) == (1, 1)
    text = plan_text(scenario, path, ["elastic"], lambda fault: "a mechanism")
    assert "at most 1 ranks lost from the world, at most 1 ranks not detecting the fault" in text


def test_the_plan_names_ranks_mechanism_and_times(tmp_path: Path) -> None:
    scenario, path = scenario_of(tmp_path, "  - {kind: loss, percent: '20%', target: {count: 2},"
                                           " start: 1s, duration: 4s}\n")
    text = plan_text(scenario, path, ["timeout"], lambda fault: f"mechanism-for-{fault.kind}")
    ranks = ",".join(map(str, scenario.targets(0)))
    assert "5 warm-up steps on every rank" in text
    assert "+  1.000 s  apply   faults.0 loss(" in text
    assert f"on ranks {ranks} by mechanism-for-loss" in text
    assert f"+  5.000 s  revert  faults.0 loss on ranks {ranks}" in text
    assert "made 6 steps after the last action" in text and "hang cap (40 s)" in text
    assert "timeout    timeout 5 s, 0 retries" in text
    assert "expects outcome failed-fast, detect_within 7 s" in text


def test_every_shipped_scenario_has_a_plan() -> None:
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = load_scenario(path)
        text = plan_text(scenario, path, list(scenario.policies), lambda fault: "m")
        assert scenario.name in text and (not scenario.faults or " apply " in text)
        for policy in scenario.policies:
            plan = build_plan(scenario, policy).trial
            assert [f.targets for f in plan.faults] == [scenario.targets(i) for i in range(len(scenario.faults))]
            # an anchored fault's last action: as late as its event is waited for, then its own offsets
            assert plan.last_action_s == max((e.offset + (e.duration or 0) + (f.anchor.until if f.anchor else 0)
                                              for e, f in zip(scenario.faults, plan.faults, strict=True)), default=0)


def test_a_trial_s_deadline_covers_its_policy_s_time_to_give_up() -> None:
    """link_down.yaml's retry (6 tries, 30 s rendezvous) gives up about 4 minutes after a
    fault for good: past 3 x the 60 s floor, so its deadline is the policy's; the timeout
    policy's 5 s is within the floor."""
    scenario = load_scenario(SCENARIOS / "link_down.yaml")
    retry, timeout = build_plan(scenario, "retry").trial, build_plan(scenario, "timeout").trial
    give_up = scenario.policy("retry").give_up_s
    assert give_up is not None and give_up > 3 * 60.0
    assert trial_deadline_s(retry) == retry.last_action_s + give_up + scenario.hang_cap
    assert trial_deadline_s(timeout) == timeout.last_action_s + 3 * 60.0
