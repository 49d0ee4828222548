"""A user's job whose steps the harness never saw (steps_not_observed): its outcome comes
from exits alone, and stalls, waste and step rates are not observed (synthetic events)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from reports.history import events_frame
from reports.metrics import trial_metrics
from runfolder.events import schema_problems
from tests.reports.report_fakes import FAULT_AT, History

NOT_OBSERVED = ("ttr_s", "max_stall_s", "wasted_rank_s", "steps_per_s_before", "steps_per_s_during",
                "steps_per_s_after")


def job_history(fault: str) -> History:
    h = History(ranks=2, policy="job")
    h.plan = dataclasses.replace(h.plan, policy_spec={}, job={"command": ["python", "job.py"]})
    h.harness(5.0, "steps_not_observed", waited_s=5.0)
    h.fault(kind=fault, targets=(1,))
    return h


def row_of(h: History) -> dict:
    events, trial = h.done()
    assert [p for e in events for p in schema_problems(e)] == []
    return trial_metrics(events_frame(events), trial)


def test_a_peer_that_exits_non_zero_after_a_kill_is_a_crash_detected_by_its_error_line():
    h = job_history("kill")
    h.harness(FAULT_AT + 0.01, "rank_exited", rank=1, pid=101, exitcode=None, signal=9)
    h.rank(0, FAULT_AT + 0.05, "job_output", cause="closed", line="Connection closed by peer")
    h.harness(FAULT_AT + 0.2, "rank_exited", rank=0, pid=100, exitcode=1, signal=None)
    h.harness(FAULT_AT + 0.3, "trial_end", reason="all-exited")
    row = row_of(h)
    assert row["outcome"] == "crashed", row["outcome_reason"]
    assert row["ttd_s"] == pytest.approx(0.05) and row["detect_cause"] == "closed"
    assert all(math.isnan(row[name]) for name in NOT_OBSERVED)


def test_every_process_ending_without_an_error_is_exited_clean():
    h = job_history("kill")
    h.harness(FAULT_AT + 0.01, "rank_exited", rank=1, pid=101, exitcode=None, signal=9)
    h.harness(FAULT_AT + 3.0, "rank_exited", rank=0, pid=100, exitcode=0, signal=None)
    h.harness(FAULT_AT + 3.1, "trial_end", reason="all-exited")
    row = row_of(h)
    assert row["outcome"] == "exited-clean", row["outcome_reason"]
    assert "r1 killed by the fault" in row["outcome_reason"]
    assert all(math.isnan(row[name]) for name in NOT_OBSERVED)


def test_ranks_still_running_at_the_cap_are_not_called_hung_nor_training():
    h = job_history("link_down")
    for r in (0, 1):
        h.harness(FAULT_AT + 30.0, "rank_exited", rank=r, pid=100 + r, exitcode=None, signal=15, stopped=True)
    h.harness(FAULT_AT + 30.2, "trial_end", reason="cap")
    row = row_of(h)
    assert row["outcome"] == "running-at-cap", row["outcome_reason"]
    assert "2 of 2 ranks still running" in row["outcome_reason"] and "steps not observed" in row["outcome_reason"]
    assert math.isnan(row["ttd_s"]) and math.isnan(row["hung_cap"])
    assert all(math.isnan(row[name]) for name in NOT_OBSERVED)

