"""Proof that a fault reached the traffic (harness.trial.traffic, reports.metrics `bypassed`),
on the fake cluster: a rank's link carries a gradient per step it makes, so a fault on a
live rank's link shows the job's bytes through it, and one on the link of a rank that
already left the job shows none and is reported `bypassed`, never absorbed."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from harness.cluster.fake import FakeBackend, FakeClock
from harness.scenario.scenario import load_scenario
from harness.trial.orchestrator import Trial
from harness.trial.scenario_run import start_run
from harness.trial.plan import build_plan
from harness.trial.progress import Progress
import reports
from runfolder.events import EVENTS_FILE, read_events, schema_problems
from runfolder.layout import trial_dir

from .test_trial_fake import HEADER, run_trial

GRADIENT_BYTES = 4 * ((64 + 1) * 256 + (256 + 1) * 256 + (256 + 1) * 10)  # the default MLP
LIVE_LINK = HEADER + """\
hang_cap: 10s
faults:
  - {kind: link_down, target: {rank: 1}, start: 2s, duration: 1s}
"""
# The loader refuses a fault on a killed rank; the plan is retargeted by hand below.
KILL_THEN_LINK = HEADER + """\
hang_cap: 10s
faults:
  - {kind: kill, target: {rank: 1}, start: 500ms}
  - {kind: link_down, target: {rank: 2}, start: 2s, duration: 1s}
"""


def traffic_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] in ("fault_applied", "fault_reverted")]


def test_a_fault_on_a_live_link_counts_the_job_s_bytes_before_and_during_it(tmp_path: Path) -> None:
    _, _, events, _, run_dir = run_trial(tmp_path, LIVE_LINK)
    applied, reverted = traffic_events(events)
    assert [p for e in events for p in schema_problems(e)] == []
    # 2 s before a 1 s fault is longer than the fault: the window is the fault's length
    assert applied["before_s"] == pytest.approx(1.0, abs=0.06)
    assert applied["allreduce_bytes"] == GRADIENT_BYTES
    assert all(4 <= s <= 5 for s in applied["steps_before"])  # 4 steps/s
    assert applied["link_bytes_before"] == [s * GRADIENT_BYTES for s in applied["steps_before"]]
    # the fake ring stalls while the link is down: no step, no byte through any link
    assert reverted["link_bytes_during"] == [0, 0, 0, 0] and reverted["steps_during"] == [0, 0, 0, 0]
    assert reverted["during_s"] == pytest.approx(1.0, abs=0.06)
    [row] = reports.analyze_run(run_dir).to_dict("records")
    assert row["outcome"] == "absorbed" and row["bypassed_faults"] == ""
    assert "host_drops" not in {e["kind"] for e in events} and math.isnan(row["host_backlog_drops"])
    assert row["link_bytes_before"] == applied["link_bytes_before"][1] > 0
    assert row["link_bytes_during"] == 0


def test_a_fault_on_the_link_of_a_rank_that_left_the_job_is_bypassed(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(KILL_THEN_LINK)
    clock = FakeClock()
    backend = FakeBackend(clock)
    run_dir = start_run(tmp_path / "runs", load_scenario(path), path, ["timeout"], backend.name, "chaos run")
    plan = build_plan(load_scenario(path), "timeout")
    kill, link = plan.trial.faults
    plan = replace(plan, trial=replace(plan.trial, faults=(kill, replace(link, targets=(1,)))))
    result = Trial(plan, trial_dir(run_dir, "timeout"), backend, Progress(quiet=True), make_injector=backend.injector,
                   clock=clock, sleep=clock.sleep, state_dir=tmp_path / "state").run()
    events, _ = read_events(result.trial_dir / EVENTS_FILE)
    kill, applied, reverted = traffic_events(events)
    assert "link_bytes_before" not in kill  # a fault on a process crosses no link
    assert applied["link_bytes_before"][1] == 0 and min(applied["steps_before"][r] for r in (0, 2, 3)) >= 4
    [row] = reports.analyze_run(run_dir).to_dict("records")
    assert row["outcome"] == "bypassed" and row["bypassed_faults"] == "1"
    assert row["outcome_reason"].startswith("fault 1 did not reach the job: its links carried 0 bytes")
