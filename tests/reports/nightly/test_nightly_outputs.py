"""What CI reads of a night: JUnit XML, the Markdown summary, the Prometheus file, the trend page."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import report_fakes as fakes
from reports import analyze_run
from reports.nightly import (NightRun, append_night, junit_xml, markdown_summary, night_history, night_registry,
                             night_report, read_history, trend_html, write_night_files)
from reports.nightly.history import trial_rows

from .nightly_fakes import info, night, seed_history, usual_repeats

TONIGHT = info(10).night
EXPECT_FAILURE = "detect_within 5 s: time to detect 5.31 s"
MISSED = (f"repeat 2: {EXPECT_FAILURE} (reproduce: chaos run scenarios/loss_20pct.yaml --backend netns "
          "--policy timeout --seed 102)")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Ten usual nights, then tonight: retry recovers ~4 s later, one timeout repeat misses its bound."""
    db = tmp_path_factory.mktemp("nightly") / "history.sqlite"
    seed_history(db, np.random.default_rng(1))
    tonight = usual_repeats(np.random.default_rng(99), ttr=16.0)
    tonight[2][0].update(expect='{"detect_within": 5.0}', expect_failures=EXPECT_FAILURE)
    append_night(db, night(10, tonight))
    history = read_history(db)
    return history, night_report(history, TONIGHT, np.random.default_rng(0))


def tonight_values(history, policy, column):
    rows = trial_rows(history, TONIGHT)
    return rows[rows["policy"] == policy][column].to_numpy()


def test_junit_one_case_per_scenario_and_policy_with_figures_and_failures(stored):
    history, report = stored
    suite = ET.fromstring(junit_xml(report)).find("testsuite")
    assert suite.get("name") == f"chaos nightly {TONIGHT}" and suite.get("timestamp") == info(10).started
    assert (suite.get("tests"), suite.get("failures")) == ("2", "2")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    assert list(cases) == [("loss_20pct", "timeout"), ("loss_20pct", "retry")]

    retry = cases["loss_20pct", "retry"]
    properties = {p.get("name"): p.get("value") for p in retry.iter("property")}
    ttr = tonight_values(history, "retry", "ttr_s")
    assert properties["outcomes"] == "recovered 5/5" and properties["ttr_s.n"] == "5"
    assert float(properties["ttr_s.median"]) == pytest.approx(np.median(ttr), rel=1e-5)
    assert float(properties["ttr_s.q1"]) == pytest.approx(np.percentile(ttr, 25), rel=1e-5)
    assert properties["ttr_s"].endswith(", n=5)") and "95% CI" in properties["ttr_s"]
    failure = retry.find("failure")
    assert "loss_20pct / retry: time to recover from fault start got worse" in failure.get("message")
    assert "Reproduce: chaos run scenarios/loss_20pct.yaml --backend netns --policy retry --seed 10" in failure.text

    timeout = cases["loss_20pct", "timeout"].find("failure")
    assert timeout.text == f"expectation: {MISSED}"
    assert {p.get("name"): p.get("value") for p in cases["loss_20pct", "timeout"].iter("property")}[
        "expectations"] == f"FAILED in 1/5: {MISSED}"


def test_markdown_summary_is_small_and_says_everything(stored):
    _, report = stored
    text = markdown_summary(report)
    assert text.startswith(f"# Chaos nightly {TONIGHT}\n\nstarted {info(10).started}; commit c010; host gpu-node-1")
    assert "**FAILED**: 1 regression(s) in 8 comparisons" in text
    assert f"- {report.gate.regressions[0].text()}" in text
    assert "| document's policy | document's claim |" in text and "| retry | packet loss" in text
    assert "| loss_20pct | retry | loss | recovered 5/5 |" in text
    assert f"FAILED in 1/5: {MISSED}" in text
    assert "data:image" not in text and "<img" not in text
    assert len(text.encode()) < 16 * 1024


def test_the_summary_gives_the_machine_and_says_when_it_differed(stored):
    _, report = stored
    assert "machine:" not in markdown_summary(report) and "Note:" not in markdown_summary(report)
    note = "tonight's machine differed from the window's nights: a Python loop step 146 ns (2.00x)"
    slower = replace(report, info=replace(report.info, loop_ns=146.0, wake_us=9.0),
                     gate=replace(report.gate, machine=note))
    text = markdown_summary(slower)
    assert "; machine: a Python loop step 146 ns, a round trip between two processes on one CPU 9 us\n" in text
    assert f"\n\nNote: {note}.\n" in text


def test_prometheus_figures_are_tonights(stored):
    history, report = stored
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(night_registry(report)).decode())
               for s in family.samples}
    series = (("policy", "retry"), ("scenario", "loss_20pct"))
    ttr = tonight_values(history, "retry", "ttr_s")
    assert samples["chaos_nightly_ttr_seconds", (*series[:1], ("quantile", "0.5"), *series[1:])] == \
        pytest.approx(np.median(ttr))
    assert samples["chaos_nightly_samples", (("metric", "ttr_s"), *series)] == 5
    assert samples["chaos_nightly_trials", (("outcome", "recovered"), *series)] == 5
    assert samples["chaos_nightly_regressions", (("metric", "ttr_s"), *series)] == 1
    assert samples["chaos_nightly_gate_passed", ()] == 0
    assert samples["chaos_nightly_started_timestamp_seconds", ()] == info(10).started_at.timestamp()
    [info_labels] = [dict(labels) for name, labels in samples if name == "chaos_nightly_info"]
    assert (info_labels["commit"], info_labels["gpu"], info_labels["nccl"]) == ("c010", "H200", "2.21.5")


def test_trend_page_plots_each_measured_metric_over_the_last_nights(stored):
    history, _ = stored
    page = trend_html(history, TONIGHT)
    # one scenario; measured: ttd_s (both policies), ttr_s and steps/s after (retry)
    assert page.count("<img") == page.count("data:image/png;base64,") == 3
    assert "loss_20pct: time to recover from fault start" in page
    assert all(f"<td>{info(i).night}</td>" in page for i in range(11))
    short = trend_html(history, TONIGHT, last=4)
    assert [f"<td>{info(i).night}</td>" in short for i in (6, 7, 10)] == [False, True, True]
    older = trend_html(history, info(5).night, last=3)
    assert [f"<td>{info(i).night}</td>" in older for i in (2, 3, 5, 6)] == [False, True, True, False]


def test_night_files_from_stored_run_folders(tmp_path):
    """The whole path from stored events: run folders -> analyze_run -> history -> files."""
    runs = []
    for repeat in range(2):
        run_dir = fakes.write_run(tmp_path / "night" / f"run-{repeat}", {
            "baseline": fakes.hung(), "timeout": fakes.failed_fast(), "retry": fakes.recovered(),
            "isolation": fakes.isolated()}, seed=repeat)
        runs.append(NightRun(repeat, "chaos run scenarios/link_down.yaml", analyze_run(run_dir)))
    db = tmp_path / "history.sqlite"
    assert append_night(db, night_history(info(0), runs))
    history = read_history(db)
    report = night_report(history, info(0).night, np.random.default_rng(0))
    written = write_night_files(tmp_path / "night", history, report)
    assert sorted(written) == ["junit.xml", "metrics.prom", "summary.md", "trends.html"]

    measured = runs[0].trials.set_index("policy")
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(written["junit.xml"]).getroot().iter("testcase")}
    assert cases["retry"]["outcomes"] == "recovered 2/2"
    assert float(cases["retry"]["ttr_s.median"]) == pytest.approx(measured.loc["retry", "ttr_s"])
    assert float(cases["isolation"]["breaker_open_s.median"]) == pytest.approx(measured.loc["isolation", "breaker_open_s"])
    assert cases["baseline"]["outcomes"] == f"hung 2/2 (hung >= {measured.loc['baseline', 'hung_cap']:g} s, the harness cap)"
    assert "ttd_s" not in cases["baseline"]  # a hang has no detection time, and none is made up

    summary = written["summary.md"].read_text()
    assert "0 comparisons with earlier nights" in summary and "4 not judged" in summary
    assert "| baseline | one node loses packets" in summary
    families = {f.name for f in text_string_to_metric_families(written["metrics.prom"].read_text())}
    assert {"chaos_nightly_ttr_seconds", "chaos_nightly_breaker_open_seconds", "chaos_nightly_trials"} <= families
    assert written["trends.html"].read_text().count("data:image/png;base64,") >= 4
