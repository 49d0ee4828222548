"""The straggler detectors scored against the slow fault's ground truth (reports.straggler),
on scripted histories; a real 16-rank run is in docs/storage-faults.md ("Scored")."""
from __future__ import annotations

import math

from reports.straggler import THRESHOLD, WINDOW, compute_flags, score, slowed, straggler_text, wait_flags

PERIOD = 0.25


def history(slow_rank: int | None = 5, factor: float = 3.0, ranks: int = 4, steps: int = 48,
            start_step: int = 16, end_step: int = 32, heartbeat_peer: int | None = None) -> list[dict]:
    """`ranks` ranks stepping every PERIOD, compute 10 ms; `slow_rank` computes `factor` x
    as long between its fault's apply and revert."""
    events: list[dict] = []
    t0 = 100.0
    if slow_rank is not None:
        events.append({"t": t0 + start_step * PERIOD, "src": "harness", "kind": "fault_applied", "index": 0,
                       "fault_kind": "slow", "targets": [slow_rank]})
        events.append({"t": t0 + end_step * PERIOD, "src": "harness", "kind": "fault_reverted", "index": 0,
                       "fault_kind": "slow", "targets": [slow_rank]})
    for step in range(steps):
        t = t0 + step * PERIOD + 0.01
        slowing = slow_rank is not None and start_step <= step < end_step
        for rank in range(ranks):
            compute = 0.010 * (factor if slowing and rank == slow_rank else 1.0) + 0.0001 * rank
            # every rank waits 50 ms in the all-reduce; while one is slow the others wait for it too
            wait = 0.05 + (0.1 if slowing and rank != slow_rank else 0.0)
            events.append({"t": t, "src": "rank", "rank": rank, "kind": "step", "step": step, "gen": 0,
                           "dur": compute + wait, "compute": compute})
    if heartbeat_peer is not None:
        events.append({"t": t0 + (start_step + 2) * PERIOD, "src": "rank", "rank": 0, "kind": "straggler",
                       "peer": heartbeat_peer, "gen": 0, "step": start_step + 2})
    return events


def test_the_slowed_rank_is_flagged_at_the_end_of_its_first_slowed_window():
    events = history(slow_rank=2)
    flags = compute_flags(events)
    assert {r for _, r in flags} == {2}
    truth = slowed(events)
    got = score("compute score", flags, truth, WINDOW * PERIOD)
    assert got.precision() == 1.0 and got.recall(frozenset({2})) == 1.0
    # steps 16-23 are one window: flagged at step 23's event, 7 steps and 10 ms after the fault
    assert math.isclose(got.first_true_s, 7 * PERIOD + 0.01)


def test_a_rank_stalled_in_bursts_computes_as_fast_but_is_the_one_its_peers_wait_for():
    """Under stops (the duty cycle) a rank's few milliseconds of compute fit between its
    stops: the compute score misses it; its peers' waits name it (a real 16-rank run: its
    wait 0.4x the ranks' median, theirs 0.8-1.0x)."""
    events = history(slow_rank=3, factor=1.0)
    assert compute_flags(events) == []
    assert {r for _, r in wait_flags(events)} == {3}
    quiet = [e for e in history(slow_rank=None)]  # everyone waits alike: nobody is flagged
    assert wait_flags(quiet) == []


def test_a_slowdown_under_the_threshold_is_not_flagged_and_a_flag_of_another_rank_is_false():
    assert compute_flags(history(slow_rank=1, factor=1.0 / THRESHOLD - 0.1)) == []
    events = history(slow_rank=1)
    wrong = [(t, 3) for t, _ in compute_flags(events)]  # a detector that names the wrong rank
    got = score("x", wrong, slowed(events), WINDOW * PERIOD)
    assert got.precision() == 0.0 and got.recall(frozenset({1})) == 0.0 and got.first_true_s is None


def test_the_report_line_scores_both_detectors_and_says_what_was_not_observed():
    events = history(slow_rank=2, heartbeat_peer=2)
    assert straggler_text(events, PERIOD, detector=True) == (
        "slowed r2; compute score: flagged r2 in 1.76 s (precision 1.00, recall 1 of 1); "
        "wait score: flagged r2 in 1.76 s (precision 1.00, recall 1 of 1); "
        "heartbeats: flagged r2 in 0.50 s (precision 1.00, recall 1 of 1)")
    no_compute = [{k: v for k, v in e.items() if k != "compute"} for e in events]
    assert straggler_text(no_compute, PERIOD, detector=False) == (
        "slowed r2; compute score: not observed; wait score: not observed; heartbeats: not observed")
    assert straggler_text(history(slow_rank=None), PERIOD, detector=True) == ""


def test_a_user_job_s_window_past_its_fault_is_measured_by_its_own_steps():
    """A user's job has no workload pace: a window that straddles the fault's end (4 slowed
    steps of 8, flagged 0.76 s after the end) is held a window of its median step (2 s)."""
    events = history(slow_rank=2, start_step=23, end_step=28)
    for e in events:
        if e["kind"] == "step":
            e["dur"] = PERIOD  # a real job's step lasts its period, its wait included
    assert straggler_text(events, 0.0, detector=False).startswith(
        "slowed r2; compute score: flagged r2 in 2.01 s (precision 1.00, recall 1 of 1); ")
