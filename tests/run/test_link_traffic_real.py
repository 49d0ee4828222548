"""Proof that a fault reached the traffic, on real namespaces (4 gloo ranks): a link fault
on a rank in the ring counts the job's bytes through its port; the same fault on the link
of a rank the elastic survivors left out (frozen by SIGSTOP) finds the link idle, and the
trial is reported `bypassed`, not by what the job went on to do."""
from __future__ import annotations

import os

from pathlib import Path

import pytest

from harness.cluster.backends import backend_named
from harness.scenario.scenario import load_scenario
from harness.trial.scenario_run import run_scenario
from harness.trial.progress import Progress
import reports
from runfolder.events import EVENTS_FILE, read_events

HEADER = """\
name: traffic
cluster: {ranks: 4}
warmup_steps: 8
settle_steps: 8
hang_cap: 20s
"""
IN_THE_RING = HEADER + """\
policies: {timeout: {timeout: 5s}}
faults:
  - {kind: link_down, target: {rank: 1}, start: 3s, duration: 8s}
"""
LEFT_OUT = HEADER + """\
policies: {elastic: {}}
faults:
  - {kind: pause, target: {rank: 1}, start: 1s, duration: 30s}
  - {kind: link_down, target: {rank: 1}, start: 8s, duration: 3s}
"""


def run(tmp_path: Path, text: str, policy: str) -> tuple[dict, list[dict]]:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    run_dir, [result] = run_scenario(load_scenario(path), path, [policy], tmp_path, backend_named("netns"),
                                     Progress(quiet=True))
    events, _ = read_events(result.trial_dir / EVENTS_FILE)
    [row] = reports.analyze_run(run_dir).to_dict("records")
    [drops] = [e for e in events if e["kind"] == "host_drops"]  # counted on a real kernel
    assert drops["packets"] >= 0 and drops["secs"] > 0 and row["host_backlog_drops"] == drops["packets"]
    [steal] = [e for e in events if e["kind"] == "machine_steal"]  # this VM's kernel counts steal
    assert steal["steal_s"] >= 0 and steal["cpus"] == len(os.sched_getaffinity(0))
    assert row["host_steal_share"] == pytest.approx(steal["steal_s"] / (steal["secs"] * steal["cpus"]))
    return row, [e for e in events if e["kind"] == "fault_applied" and "link_bytes_before" in e]


@pytest.mark.requires_root
def test_a_link_in_the_ring_carries_the_job_s_bytes(tmp_path: Path, leaves_nothing) -> None:
    row, [applied] = run(tmp_path, IN_THE_RING, "timeout")
    floor = max(applied["steps_before"]) * applied["allreduce_bytes"]
    assert max(applied["steps_before"]) >= 4  # 4 steps/s for 3 s
    assert applied["link_bytes_before"][1] >= floor  # a ring all-reduce sends more than one copy
    assert row["outcome"] == "failed-fast" and row["bypassed_faults"] == ""
    assert row["link_bytes_during"] < applied["allreduce_bytes"] / 10  # the port was down


@pytest.mark.requires_root
def test_a_link_the_job_left_is_bypassed(tmp_path: Path, leaves_nothing) -> None:
    row, [applied] = run(tmp_path, LEFT_OUT, "elastic")
    assert applied["steps_before"][1] == 0 and min(applied["steps_before"][r] for r in (0, 2, 3)) >= 4
    assert applied["link_bytes_before"][1] < applied["allreduce_bytes"] / 10  # heartbeats only
    assert row["outcome"] == "bypassed" and row["bypassed_faults"] == "1"
