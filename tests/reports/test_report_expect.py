"""Expectations of a trial's plan (typed: outcome names, float seconds) against measured metrics."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from reports.expect import check_expectations
from runfolder.plan import Expectation

NAN = math.nan


def row(**values):
    return {"outcome": "failed-fast", "ttd_s": 5.1, "ttr_s": NAN, "breaker_open_s": NAN, "hung_cap": NAN,
            **values}


def test_no_expectations_no_failures():
    assert check_expectations(row(), None) == []
    assert check_expectations(row(), Expectation()) == []


def test_met():
    assert check_expectations(row(), Expectation(outcome=("failed-fast",), detect_within=6.0)) == []
    assert check_expectations(row(), Expectation(outcome=("isolated", "failed-fast"), detect_within=6.0)) == []


def test_outcome_mismatch_names_both():
    [failure] = check_expectations(row(), Expectation(outcome=("recovered",)))
    assert failure == "outcome: expected recovered, measured failed-fast"


def test_detect_within_exceeded_names_bound_and_value():
    [failure] = check_expectations(row(), Expectation(detect_within=5.0))
    assert failure == "detect_within 5 s: time to detect 5.10 s"


def test_recover_within_on_a_hang_shows_the_cap_not_a_number():
    [outcome, recover] = check_expectations(row(outcome="hung", ttd_s=NAN, hung_cap=30.0),
                                            Expectation(outcome=("recovered",), recover_within=12.0))
    assert outcome == "outcome: expected recovered, measured hung"
    assert recover == "recover_within 12 s: time to recover nothing measured: hung >= 30 s"


def test_breaker_within_exceeded_and_not_measured():
    [late] = check_expectations(row(outcome="isolated", breaker_open_s=31.5), Expectation(breaker_within=30.0))
    assert late == "breaker_within 30 s: breaker open 31.50 s"
    [missing] = check_expectations(row(), Expectation(breaker_within=30.0))
    assert missing == "breaker_within 30 s: breaker open nothing measured (outcome failed-fast)"


def test_suspects_at_most_counts_the_detectors_suspect_events():
    control = Expectation(outcome=("no-fault",), suspects_at_most=0)
    assert check_expectations(row(outcome="no-fault", suspect_events=0), control) == []
    [false_alarm] = check_expectations(row(outcome="no-fault", suspect_events=3), control)
    assert false_alarm == "suspects_at_most 0: 3 suspect events"
    assert check_expectations(row(suspect_events=2), Expectation(suspects_at_most=2)) == []


def test_ranks_lost_and_ranks_undetected_are_counts_that_hold_at_any_cluster_size():
    kill = Expectation(outcome=("continued",), ranks_lost_at_most=1, undetected_at_most=1)
    for ranks in (16, 64):
        survivors = ranks - 1
        assert check_expectations(row(outcome="continued", ranks=ranks, final_world=survivors,
                                      detect_ranks=survivors), kill) == []
    [lost, undetected] = check_expectations(row(outcome="continued", ranks=64, final_world=62, detect_ranks=60), kill)
    assert lost == "ranks_lost_at_most 1: a final world of 62 of 64 ranks"
    assert undetected == "undetected_at_most 1: 60 of 64 ranks detected the fault"
    [no_group] = check_expectations(row(ranks=16, final_world=pd.NA, detect_ranks=0), Expectation(ranks_lost_at_most=1))
    assert no_group == "ranks_lost_at_most 1: no group formed after the fault"


def test_an_unknown_outcome_name_is_refused_when_the_expectation_is_made():
    with pytest.raises(ValueError, match="'soon' is not one of incomplete, no-fault, bypassed, hung"):
        Expectation(outcome=("soon",))
