"""The source document's table, row by row, over a night's repeats."""
from __future__ import annotations

import numpy as np

from reports.nightly import document_checks, document_table, summarize_night

from .nightly_fakes import night, trial

TTR = (10.0, 11.0, 14.0)


def repeats(with_isolation: bool = True) -> list[list[dict]]:
    out = []
    for r, ttr in enumerate(TTR):
        seed = 10 + r
        rows = [trial(policy="baseline", outcome="hung", seed=seed, hung_cap=30.0),
                trial(policy="timeout", outcome="failed-fast", seed=seed, ttd_s=5.1 + r / 10),
                trial(policy="retry", seed=seed, ttr_s=ttr),
                trial(policy="retry_fd", base="retry", seed=seed, ttr_s=1.0 + r / 10),
                trial(scenario="link_down", fault="link_down", policy="retry", seed=seed, ttr_s=27.0)]
        if with_isolation:
            rows.append(trial(scenario="unplugged", fault="blackhole", policy="isolation", outcome="isolated",
                              seed=seed, breaker_open_s=8.0 + r / 10))
        out.append(rows)
    return out


def checks_of(history):
    return document_checks(history, "2025-01-01", summarize_night(history, "2025-01-01", np.random.default_rng(0)))


def test_every_row_of_the_document_with_median_spread_and_verdict():
    checks = checks_of(night(0, repeats()))
    table = {(c.document_policy, c.scenario, c.policy): c for c in checks}
    # retry ran on the document's fault (loss) and on link_down: only the loss rows count,
    # the variant beside the policy itself
    assert list(table) == [("baseline", "loss_20pct", "baseline"), ("timeout", "loss_20pct", "timeout"),
                           ("retry", "loss_20pct", "retry"), ("retry", "loss_20pct", "retry_fd"),
                           ("isolation", "unplugged", "isolation")]

    baseline = table["baseline", "loss_20pct", "baseline"]
    assert baseline.measured == "hung 3/3 (hung >= 30 s, the harness cap)"
    assert baseline.verdict == "partly"
    assert "cannot be seen under the cap" in baseline.why

    timeout = table["timeout", "loss_20pct", "timeout"]
    assert timeout.measured.startswith("failed-fast 3/3; time to detect, first rank 5.20 s (IQR 5.15-5.25, 95% CI")
    assert timeout.verdict == "yes"
    assert timeout.why == "per run: yes 3/3; on the median: 5.2 s <= 15 s; policy timeout 5 s"

    retry = table["retry", "loss_20pct", "retry"]  # 10, 11, 14 s against "within 12 s"
    assert retry.measured.startswith("recovered 3/3; time to recover from fault start 11.0 s (IQR 10.5-12.5")
    assert retry.measured.endswith(", n=3)")
    assert retry.verdict == "partly"
    assert retry.why == "per run: yes 2/3, no 1/3; on the median: 11.0 s <= 12 s"
    assert table["retry", "loss_20pct", "retry_fd"].verdict == "yes"

    isolation = table["isolation", "unplugged", "isolation"]
    assert isolation.verdict == "yes"
    assert "the document's fault was node unplugged, this one blackhole" in isolation.why


def test_a_row_the_night_did_not_run_says_so():
    isolation = checks_of(night(0, repeats(with_isolation=False)))[-1]
    assert (isolation.document_policy, isolation.verdict, isolation.why) == (
        "isolation", "not run", "the night ran no isolation policy")


def test_a_policy_that_never_reaches_the_claimed_outcome_does_not_hold():
    rows = [[trial(policy="retry", outcome="failed-fast", seed=s, ttd_s=5.0)] for s in (1, 2)]
    retry = next(c for c in checks_of(night(0, rows)) if c.document_policy == "retry")
    assert retry.measured == "failed-fast 2/2"
    assert retry.verdict == "no" and retry.why == "per run: no 2/2; on the median: failed-fast instead of recovered"


def test_the_table_has_one_line_per_check():
    checks = checks_of(night(0, repeats()))
    lines = document_table(checks).splitlines()
    assert lines[0] == "| document's policy | document's claim | scenario | policy | measured | claim held? |"
    assert len(lines) == 2 + len(checks)
    assert "| retry | packet loss -> backoff retry -> communication restored within 12 s (recover <= 12 s) " \
           "| loss_20pct | retry | recovered 3/3;" in lines[4]
