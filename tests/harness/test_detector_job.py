"""The failure detector and the elastic policy on real namespaces with 16 real gloo ranks.

Each test runs policies of a shipped scenario through the pytest plugin's `chaos_check`,
as `pytest scenarios/` does, and looks closer than the scenario's expectations: at every
rank's events and at the times from the report's metrics. The scenario's own test
(scenarios/*.yaml, later in the session) judges the same run instead of a second one.
Bounds are the issue's targets with a margin for a loaded CI machine (16 ranks on 2
cores): the detector's threshold is 0.4 s and its digest comes every 50 ms, so a silence
is seen at ~0.4-0.5 s when nothing else runs; the tests allow 2 s. Run one heavy job at a
time (`flock /tmp/chaos-cpu.lock`).
"""
from __future__ import annotations

import json

import pytest

from runfolder.heartbeats import read_heartbeat_gaps
from tests.conftest import REPO

pytestmark = pytest.mark.requires_root
SCENARIOS = REPO / "scenarios"
SILENT_TTD_S = 2.0      # target 1.0 s
KILLED_TTD_S = 1.0      # target 0.3 s
STEPPING_AGAIN_S = 6.0  # target 3 s after a permanent fault starts
TTR_AFTER_HEAL_S = 3.0  # target 1 s


def run(chaos_check, scenario: str, *policies: str) -> dict:
    """Each policy's check; every expectation of the scenario met."""
    checks = {policy: chaos_check(SCENARIOS / scenario, policy) for policy in policies}
    for check in checks.values():
        assert not check.failures, check.failure_text()
    return checks


def trial_events(check) -> list[dict]:
    lines = (check.trial_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def rank_events(check, kind: str) -> list[dict]:
    return [e for e in trial_events(check) if e["kind"] == kind and e["src"] == "rank"]


def test_elastic_goes_on_with_15_after_a_kill(chaos_check, leaves_nothing):
    checks = run(chaos_check, "elastic_kill.yaml", "elastic")
    # asked again (as scenarios/elastic_kill.yaml::elastic will), the session's run is reused
    assert chaos_check(SCENARIOS / "elastic_kill.yaml", "elastic") is checks["elastic"]
    row = checks["elastic"].metrics
    assert row["outcome"] == "continued" and row["final_world"] == 15
    # every survivor learns within a fraction of a second: through rank 5's closed lease, or
    # (its two ring neighbours, often first) through gloo's "connection closed by peer"
    suspects = {e["rank"]: e for e in rank_events(checks["elastic"], "suspect") if e["peer"] == 5}
    errors = {e["rank"]: e for e in rank_events(checks["elastic"], "collective_error")}
    assert {e["via"] for e in suspects.values()} == {"connection"}
    first = {r: min(e["t"] for e in (suspects.get(r), errors.get(r)) if e) for r in
             set(suspects) | set(errors)}
    assert set(first) == set(range(16)) - {5}
    [kill] = [e for e in trial_events(checks["elastic"]) if e["kind"] == "fault_applied"]
    assert max(first.values()) - kill["t"] <= KILLED_TTD_S
    assert row["ttr_s"] <= STEPPING_AGAIN_S
    # the control plane kept every rank's heartbeat gaps, rank 5's up to its kill
    gaps = read_heartbeat_gaps(checks["elastic"].trial_dir)
    assert sorted(gaps.ranks) == list(range(16)) and all(g.gaps > 0 for g in gaps.ranks.values())
    assert 0.04 <= gaps.quantile_s(0.5) <= 0.1
    assert gaps.ranks[5].gaps < min(g.gaps for rank, g in gaps.ranks.items() if rank != 5)


def test_elastic_goes_on_with_15_when_a_host_goes_silent_for_good(chaos_check, leaves_nothing):
    checks = run(chaos_check, "elastic_blackhole.yaml", "elastic")
    row = checks["elastic"].metrics
    assert row["outcome"] == "continued" and row["final_world"] == 15
    assert row["ttd_s"] <= SILENT_TTD_S and row["ttd_max_s"] <= SILENT_TTD_S
    assert row["detect_ranks"] == 16   # the 15 survivors, and rank 5 knows it is cut off
    assert row["ttr_s"] <= STEPPING_AGAIN_S
    [breaker] = rank_events(checks["elastic"], "breaker_open")
    assert breaker["rank"] == 5 and "control plane" in breaker["reason"]
    assert row["breaker_open_s"] <= SILENT_TTD_S + 1.0


def test_detector_policies_after_a_10s_link_down(chaos_check, leaves_nothing):
    checks = run(chaos_check, "detector_link_down.yaml", "retry_fd", "elastic")
    retry = checks["retry_fd"].metrics
    assert retry["outcome"] == "recovered" and retry["policy_base"] == "retry"
    assert retry["ttd_s"] <= SILENT_TTD_S
    assert retry["ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    elastic = checks["elastic"].metrics
    assert elastic["outcome"] == "continued" and elastic["final_world"] == 15
    assert elastic["ttr_s"] <= STEPPING_AGAIN_S


def test_detector_policies_after_a_10s_freeze(chaos_check, leaves_nothing):
    checks = run(chaos_check, "detector_pause.yaml", "retry_fd", "elastic", "elastic_rejoin")
    assert checks["retry_fd"].metrics["outcome"] == "recovered"
    assert checks["retry_fd"].metrics["ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    assert checks["elastic"].metrics["outcome"] == "continued"
    # thawed into a generation that left it out, rank 5 leaves by itself...
    [breaker] = rank_events(checks["elastic"], "breaker_open")
    assert breaker["rank"] == 5 and "left out" in breaker["reason"]
    # ...or, with rejoin, asks to be let back in
    assert checks["elastic_rejoin"].metrics["outcome"] == "recovered"
    assert checks["elastic_rejoin"].metrics["ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    [breaker] = rank_events(checks["elastic_rejoin"], "breaker_open")
    assert breaker["rank"] == 5 and "left out" in breaker["reason"]
    assert [e["rank"] for e in rank_events(checks["elastic_rejoin"], "rejoin_admitted")] == [5]


def test_with_rejoin_the_rank_left_out_is_let_back_in_when_its_link_returns(chaos_check, leaves_nothing):
    checks = run(chaos_check, "elastic_rejoin.yaml", "elastic_rejoin")
    row = checks["elastic_rejoin"].metrics
    assert row["outcome"] == "recovered" and row["final_world"] == 16
    assert row["rejoined_ranks"] == 1 and row["ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    events = trial_events(checks["elastic_rejoin"])
    healed = next(e["t"] for e in events if e["kind"] == "fault_reverted")
    mine = [e["kind"] for e in events if e["rank"] == 5 and e["kind"] in
            ("breaker_open", "resources_released", "rejoin_request", "rejoin_admitted", "exit")]
    assert mine[:4] == ["breaker_open", "resources_released", "rejoin_request", "rejoin_admitted"]
    [request] = rank_events(checks["elastic_rejoin"], "rejoin_request")
    assert request["t"] > healed  # it asked once it heard the control plane again, not before
    [admit] = rank_events(checks["elastic_rejoin"], "admit")
    assert admit["peers"] == [5] and admit["rank"] == 0
    # every member moved to the new generation after the same step
    first = {e["rank"]: e["step"] for e in reversed(rank_events(checks["elastic_rejoin"], "step"))
             if e["gen"] == admit["gen"]}
    assert len(first) == 16 and len(set(first.values())) == 1


def test_a_lossy_rank_is_a_straggler_not_a_suspect(chaos_check, leaves_nothing):
    checks = run(chaos_check, "detector_loss.yaml", "elastic")
    assert checks["elastic"].metrics["outcome"] in ("absorbed", "recovered")
    assert not [e for e in rank_events(checks["elastic"], "suspect") if e["via"] == "heartbeat"]
    assert any(e["peer"] == 5 for e in rank_events(checks["elastic"], "straggler"))
