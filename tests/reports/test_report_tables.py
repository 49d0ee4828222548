"""The comparison table against the source document's claims."""
from __future__ import annotations

import pytest

import pandas as pd

import report_fakes as fakes
from reports.history import events_frame
from reports.metrics import trial_metrics
from reports.tables import compare_table, format_table, judge_claim, measured_time, what_happened


def metrics_of(history) -> dict:
    events, trial = history
    return trial_metrics(events_frame(events), trial)


def test_hung_is_at_least_the_cap_and_the_document_figure_cannot_be_seen():
    row = metrics_of(fakes.hung())
    assert measured_time(row) == ">= 30 s (hung)"
    assert "hung >= 30 s (harness cap)" in what_happened(row)
    verdict, why = judge_claim(row)
    assert verdict == "partly"
    assert "hung >= 30 s cap: the document's stuck ~5.2 h cannot be seen under the cap" in why


def test_timeout_claim_held_with_context():
    row = metrics_of(fakes.failed_fast())
    assert what_happened(row) == ("r1 link_down -> 4/4 ranks detect at 5.1-5.4 s (timeout, first r0) "
                                  "-> exit failed-fast by 5.7 s")
    verdict, why = judge_claim(row)
    assert verdict == "yes"
    assert why.startswith("5.1 s <= 15 s")
    assert "the document's fault was 20% packet loss, this one link_down" in why
    assert "policy timeout 5 s" in why



@pytest.mark.parametrize("column, unsaid, said, text", [
    ("host_backlog_drops", 0, 2900, " (the host's kernel dropped 2900 packets of its own: receive backlog full)"),
    ("host_steal_share", 0.01, 0.12, " (the VM's host took 12% of this machine's CPU time meanwhile: steal)"),
])
def test_a_slowness_or_loss_no_fault_injected_is_said_only_where_worth_saying(column, unsaid, said, text):
    row = metrics_of(fakes.failed_fast())
    story = what_happened(row)
    assert what_happened({**row, column: unsaid}) == story
    assert what_happened({**row, column: said}) == story + text


def test_retry_claim_fails_on_another_outcome():
    verdict, why = judge_claim(metrics_of(fakes.retries_exhausted()))
    assert verdict == "no" and why.startswith("retries-exhausted instead of recovered")


def test_retry_claim_held():
    row = metrics_of(fakes.recovered())
    assert judge_claim(row)[0] == "yes"
    assert measured_time(row) == "recover 8.0 s"
    assert "1 retries -> all ranks step again at 8.0 s" in what_happened(row)


def test_a_rank_let_back_in_is_told():
    row = metrics_of(fakes.rejoined())
    assert what_happened(row).endswith(
        "-> 1 left out, let back in at 10.4 s -> all ranks step again at 10.6 s")


def test_isolation_claim_notes_unmeasured_gpu_release():
    verdict, why = judge_claim(metrics_of(fakes.isolated()))
    assert verdict == "yes" and "GPU memory release not measured" in why


def test_policy_outside_the_document():
    assert judge_claim(metrics_of(fakes.continued())) == ("-", "not in the document")


def test_format_table_one_row_per_trial():
    df = pd.DataFrame([metrics_of(h()) for h in (fakes.hung, fakes.failed_fast, fakes.recovered,
                                                  fakes.isolated)])
    df["expect"], df["expect_failures"] = "", ""
    lines = format_table(df).splitlines()
    assert lines[0].startswith("| policy | fault | what happened (measured) | measured time |")
    assert len(lines) == 2 + 4
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| baseline", "| timeout", "| retry", "| isolation"]


def test_compare_table_side_by_side():
    a = pd.DataFrame([metrics_of(fakes.failed_fast())])
    b = pd.DataFrame([metrics_of(fakes.hung())])
    text = compare_table([("run-a", a), ("run-b", b)])
    assert "| timeout | link_down | failed-fast, detect 5.1 s | - |" in text
    assert "| baseline | link_down | - | hung, >= 30 s (hung) |" in text


def test_a_detection_is_told_after_the_fault_it_fell_under_not_the_first_one():
    """Three faults on r5 (a 3 s pause at +0 s no rank noticed, a link down at +18 s, a kill at
    +43 s): the ranks detect at 23.0-23.2 s, which is the link down's, 5.0-5.2 s after it."""
    row = {**metrics_of(fakes.isolated()), "fault": "pause", "fault_targets": "5",
           "ttd_s": 23.0, "ttd_max_s": 23.2, "breaker_open_s": 44.0, "released_s": float("nan"),
           "f0_fault": "pause", "f0_targets": "5", "f0_start_s": 0.0, "f0_ttd_s": float("nan"),
           "f1_fault": "link_down", "f1_targets": "5", "f1_start_s": 18.0, "f1_ttd_s": 5.0,
           "f2_fault": "kill", "f2_targets": "5", "f2_start_s": 43.0, "f2_ttd_s": float("nan")}
    assert what_happened(row) == (
        "r5 pause: no rank detects it; r5 link_down at +18.0 s -> 4/4 ranks detect at 5.0-5.2 s (timeout, "
        "first r0) -> breaker opens at 26.0 s (1.0 s after r5 kill at +43.0 s); GPU memory released: not observed")
