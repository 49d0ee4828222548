"""The failure detector and the elastic policy on real namespaces with 16 real gloo ranks.

Each test runs a shipped scenario with `chaos run`, as a user would, and checks the
outcome and the times from the report's metrics. Bounds are the issue's targets with a
margin for a loaded CI machine (16 ranks on 2 cores): the detector's threshold is 0.4 s
and its digest comes every 50 ms, so a silence is seen at ~0.4-0.5 s when nothing else
runs; the tests allow 2 s. Run one heavy job at a time (`flock /tmp/chaos-cpu.lock`).
"""
from __future__ import annotations

import json

import pytest

import reports
from tests.conftest import REPO, chaos_cli

pytestmark = [pytest.mark.requires_root, pytest.mark.slow]
SCENARIOS = REPO / "scenarios"
SILENT_TTD_S = 2.0      # target 1.0 s
KILLED_TTD_S = 1.0      # target 0.3 s
STEPPING_AGAIN_S = 6.0  # target 3 s after a permanent fault starts
TTR_AFTER_HEAL_S = 3.0  # target 1 s


def run(tmp_path, scenario: str, *policies: str):
    args = [arg for p in policies for arg in ("--policy", p)]
    done = chaos_cli("run", str(SCENARIOS / scenario), *args, "--out", str(tmp_path), "--quiet",
                     timeout=900)
    (run_dir,) = tmp_path.iterdir()
    table = reports.analyze_run(run_dir).set_index("policy")
    return done, run_dir, table


def trial_events(run_dir, policy: str) -> list[dict]:
    lines = (run_dir / "trials" / policy / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def rank_events(run_dir, policy: str, kind: str) -> list[dict]:
    return [e for e in trial_events(run_dir, policy) if e["kind"] == kind and e["src"] == "rank"]


def test_elastic_goes_on_with_15_after_a_kill(tmp_path, leaves_nothing):
    done, run_dir, table = run(tmp_path, "elastic_kill.yaml", "elastic")
    assert done.returncode == 0, done.stdout + done.stderr
    row = table.loc["elastic"]
    assert row["outcome"] == "continued" and row["final_world"] == 15
    # every survivor learns within a fraction of a second: through rank 5's closed lease, or
    # (its two ring neighbours, often first) through gloo's "connection closed by peer"
    suspects = {e["rank"]: e for e in rank_events(run_dir, "elastic", "suspect") if e["peer"] == 5}
    errors = {e["rank"]: e for e in rank_events(run_dir, "elastic", "collective_error")}
    assert {e["via"] for e in suspects.values()} == {"connection"}
    first = {r: min(e["t"] for e in (suspects.get(r), errors.get(r)) if e) for r in
             set(suspects) | set(errors)}
    assert set(first) == set(range(16)) - {5}
    [kill] = [e for e in trial_events(run_dir, "elastic") if e["kind"] == "fault_applied"]
    assert max(first.values()) - kill["t"] <= KILLED_TTD_S
    assert row["ttr_s"] <= STEPPING_AGAIN_S


def test_elastic_goes_on_with_15_when_a_host_goes_silent_for_good(tmp_path, leaves_nothing):
    done, run_dir, table = run(tmp_path, "elastic_blackhole.yaml", "elastic")
    assert done.returncode == 0, done.stdout + done.stderr
    row = table.loc["elastic"]
    assert row["outcome"] == "continued" and row["final_world"] == 15
    assert row["ttd_s"] <= SILENT_TTD_S and row["ttd_max_s"] <= SILENT_TTD_S
    assert row["detect_ranks"] == 16   # the 15 survivors, and rank 5 knows it is cut off
    assert row["ttr_s"] <= STEPPING_AGAIN_S
    [breaker] = rank_events(run_dir, "elastic", "breaker_open")
    assert breaker["rank"] == 5 and "control plane" in breaker["reason"]
    assert row["breaker_open_s"] <= SILENT_TTD_S + 1.0


def test_detector_policies_after_a_10s_link_down(tmp_path, leaves_nothing):
    done, _, table = run(tmp_path, "detector_link_down.yaml", "retry_fd", "elastic")
    assert done.returncode == 0, done.stdout + done.stderr
    retry = table.loc["retry_fd"]
    assert retry["outcome"] == "recovered" and retry["policy_base"] == "retry"
    assert retry["ttd_s"] <= SILENT_TTD_S
    assert retry["ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    elastic = table.loc["elastic"]
    assert elastic["outcome"] == "continued" and elastic["final_world"] == 15
    assert elastic["ttr_s"] <= STEPPING_AGAIN_S


def test_detector_policies_after_a_10s_freeze(tmp_path, leaves_nothing):
    done, run_dir, table = run(tmp_path, "detector_pause.yaml", "retry_fd", "elastic",
                               "elastic_rejoin")
    assert done.returncode == 0, done.stdout + done.stderr
    assert table.loc["retry_fd", "outcome"] == "recovered"
    assert table.loc["retry_fd", "ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    assert table.loc["elastic", "outcome"] == "continued"
    # thawed into a generation that left it out, rank 5 leaves by itself...
    [breaker] = rank_events(run_dir, "elastic", "breaker_open")
    assert breaker["rank"] == 5 and "left out" in breaker["reason"]
    # ...or, with rejoin, asks to be let back in
    assert table.loc["elastic_rejoin", "outcome"] == "recovered"
    assert table.loc["elastic_rejoin", "ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    [breaker] = rank_events(run_dir, "elastic_rejoin", "breaker_open")
    assert breaker["rank"] == 5 and "left out" in breaker["reason"]
    assert [e["rank"] for e in rank_events(run_dir, "elastic_rejoin", "rejoin_admitted")] == [5]


def test_with_rejoin_the_rank_left_out_is_let_back_in_when_its_link_returns(tmp_path, leaves_nothing):
    done, run_dir, table = run(tmp_path, "elastic_rejoin.yaml", "elastic_rejoin")
    assert done.returncode == 0, done.stdout + done.stderr
    row = table.loc["elastic_rejoin"]
    assert row["outcome"] == "recovered" and row["final_world"] == 16
    assert row["rejoined_ranks"] == 1 and row["ttr_after_end_s"] <= TTR_AFTER_HEAL_S
    events = trial_events(run_dir, "elastic_rejoin")
    healed = next(e["t"] for e in events if e["kind"] == "fault_reverted")
    mine = [e["kind"] for e in events if e["rank"] == 5 and e["kind"] in
            ("breaker_open", "resources_released", "rejoin_request", "rejoin_admitted", "exit")]
    assert mine[:4] == ["breaker_open", "resources_released", "rejoin_request", "rejoin_admitted"]
    [request] = rank_events(run_dir, "elastic_rejoin", "rejoin_request")
    assert request["t"] > healed  # it asked once it heard the control plane again, not before
    [admit] = rank_events(run_dir, "elastic_rejoin", "admit")
    assert admit["peers"] == [5] and admit["rank"] == 0
    # every member moved to the new generation after the same step
    first = {e["rank"]: e["step"] for e in reversed(rank_events(run_dir, "elastic_rejoin", "step"))
             if e["gen"] == admit["gen"]}
    assert len(first) == 16 and len(set(first.values())) == 1


def test_a_lossy_rank_is_a_straggler_not_a_suspect(tmp_path, leaves_nothing):
    done, run_dir, table = run(tmp_path, "detector_loss.yaml", "elastic")
    assert done.returncode == 0, done.stdout + done.stderr
    assert table.loc["elastic", "outcome"] in ("absorbed", "recovered")
    assert not [e for e in rank_events(run_dir, "elastic", "suspect") if e["via"] == "heartbeat"]
    assert any(e["peer"] == 5 for e in rank_events(run_dir, "elastic", "straggler"))
