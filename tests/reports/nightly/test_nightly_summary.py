"""A night per scenario x policy: counts, figures with spread and n, expectations."""
from __future__ import annotations

import math

import numpy as np

from reports.nightly import summarize_night

from .nightly_fakes import night, trial

EXPECT = '{"outcome": "recovered"}'


def summaries(repeats):
    return {(p.scenario, p.policy): p for p in summarize_night(night(0, repeats), "2025-01-01", np.random.default_rng(0))}


def test_one_summary_per_scenario_and_policy_in_run_order():
    repeats = [[trial(policy="retry", seed=s, ttr_s=10.0 + s, expect=EXPECT),
                trial(policy="baseline", outcome="hung", seed=s, hung_cap=30.0 + s, expect=EXPECT,
                      expect_failures="outcome: expected recovered, measured hung")] for s in (1, 2, 3)]
    found = summaries(repeats)
    assert list(found) == [("loss_20pct", "retry"), ("loss_20pct", "baseline")]

    retry = found["loss_20pct", "retry"]
    assert retry.outcome_text() == "recovered 3/3" and math.isnan(retry.hung_cap)
    assert [f.metric.column for f in retry.figures] == ["ttr_s"]  # only what was measured
    ttr = retry.figure("ttr_s")
    assert (ttr.quartiles.n, ttr.quartiles.median) == (3, 12.0) and ttr.interval is not None
    assert ttr.text().startswith("12.0 s (IQR 11.5-12.5, 95% CI ")
    assert retry.figure("breaker_open_s") is None
    assert retry.expectation_text() == "met 3/3"

    baseline = found["loss_20pct", "baseline"]
    assert baseline.outcome_text() == "hung 3/3 (hung >= 33 s, the harness cap)" and baseline.figures == ()
    assert baseline.expectation_text().startswith(
        "FAILED in 3/3: repeat 0: outcome: expected recovered, measured hung (reproduce: chaos run "
        "scenarios/loss_20pct.yaml --backend netns --policy baseline --seed 1); repeat 1: ")


def test_one_repeat_is_labelled_and_has_no_interval():
    [only] = summaries([[trial(policy="timeout", outcome="failed-fast", ttd_s=5.2)]]).values()
    figure = only.figure("ttd_s")
    assert figure.interval is None and figure.text() == "5.20 s (n=1, one run: no spread)"
    assert only.expectation_text() == "none set"


def test_a_metric_measured_in_some_repeats_counts_only_those():
    repeats = [[trial(policy="retry", seed=1, ttr_s=9.0)],
               [trial(policy="retry", seed=2, outcome="failed-fast", ttd_s=5.0)]]
    [retry] = summaries(repeats).values()
    assert retry.outcome_text() == "failed-fast 1/2, recovered 1/2"
    assert retry.figure("ttr_s").text() == "9.00 s (n=1, one run: no spread)"
