"""Expectations of a scenario against measured metrics."""
from __future__ import annotations

import math

from reports.expect import check_expectations

NAN = math.nan


def row(**values):
    return {"outcome": "failed-fast", "ttd_s": 5.1, "ttr_s": NAN, "breaker_open_s": NAN, "hung_cap": NAN,
            **values}


def test_no_expectations_no_failures():
    assert check_expectations(row(), None) == []
    assert check_expectations(row(), {}) == []


def test_met():
    assert check_expectations(row(), {"outcome": "failed-fast", "detect_within": 6}) == []
    assert check_expectations(row(), {"outcome": ["isolated", "failed-fast"], "detect_within": "6s"}) == []


def test_outcome_mismatch_names_both():
    [failure] = check_expectations(row(), {"outcome": "recovered"})
    assert failure == "outcome: expected recovered, measured failed-fast"


def test_detect_within_exceeded_names_bound_and_value():
    [failure] = check_expectations(row(), {"detect_within": "5s"})
    assert failure == "detect_within 5 s: time to detect 5.10 s"


def test_recover_within_on_a_hang_shows_the_cap_not_a_number():
    [outcome, recover] = check_expectations(row(outcome="hung", ttd_s=NAN, hung_cap=30.0),
                                            {"outcome": "recovered", "recover_within": 12})
    assert outcome == "outcome: expected recovered, measured hung"
    assert recover == "recover_within 12 s: time to recover nothing measured: hung >= 30 s"


def test_breaker_within_exceeded_and_not_measured():
    [late] = check_expectations(row(outcome="isolated", breaker_open_s=31.5), {"breaker_within": "30s"})
    assert late == "breaker_within 30 s: breaker open 31.50 s"
    [missing] = check_expectations(row(), {"breaker_within": 30})
    assert missing == "breaker_within 30 s: breaker open nothing measured (outcome failed-fast)"


def test_unreadable_bound_is_a_failure():
    [failure] = check_expectations(row(), {"detect_within": "soon"})
    assert failure.startswith("detect_within: unreadable bound 'soon'")
