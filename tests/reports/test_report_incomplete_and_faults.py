"""A killed run is reported as incomplete (where it ended, nothing judged), and every fault
of a timeline gets its own detect / recover / breaker figures in metrics, table and plot."""
from __future__ import annotations

import math
import shutil

import pandas as pd

import report_fakes as fakes
from reports import analyze_run, report_main
from reports.history import events_frame
from reports.metrics import trial_metrics
from reports.plots import timeline_figure
from reports.tables import fault_rows, format_table, table_rows
from reports.writer import write_reports
from runfolder.layout import REPORT_HTML, REPORT_MARKDOWN


def killed_during_the_fault():
    """The harness dies 3 s into a link_down: no revert, no trial_end, ranks still stepping."""
    h = fakes.History(policy="timeout")
    h.harness(0.5, "cluster_up", secs=0.4)
    h.steps(0.0, fakes.FAULT_AT)
    h.harness(2.0, "warmup_done", step=8)
    h.fault(end=None)
    h.steps(fakes.FAULT_AT + 0.1, fakes.FAULT_AT + 3.0)
    return fakes.expecting(h.done(), outcome=("failed-fast",), detect_within=7.0)


def a_rank_gone_in_warm_up():
    """A user's job whose rank 2 timed out in its own rendezvous: the harness stops the trial
    on an error before the fault (trial_end reason error), the others exit after it."""
    h = fakes.History(policy="timeout")
    h.harness(0.5, "cluster_up", secs=0.4)
    h.harness(6.0, "rank_exited", rank=2, pid=102, exitcode=1, signal=None)
    for r in (0, 1, 3):
        h.harness(6.5, "rank_exited", rank=r, pid=100 + r, exitcode=-15, signal=15)
    h.harness(6.6, "trial_end", reason="error")
    return fakes.expecting(h.done(), outcome=("crashed",), detect_within=1.0)


def two_faults():
    """Link down on r1 at 10-13 s (absorbed, no error); link down on r2 at 20-23 s: errors
    at 21.5 s, restore, every rank steps again from 24 s."""
    h = fakes.History(policy="retry", timeout=1.5)
    h.steps(0.0, fakes.FAULT_AT)
    h.fault(targets=(1,), end=13.0)
    h.steps(13.2, 20.0)
    h.fault(targets=(2,), start=20.0, end=23.0, index=1)
    h.each(None, 21.5, "collective_error", step=60, gen=0, phase="step", cause="timeout", error="Timed out")
    h.each(None, 23.9, "restored", step=60, gen=1, source="checkpoint")
    h.steps(24.0, 30.0, gen=1)
    h.end(30.0, survivors=list(range(fakes.RANKS)))
    return h.done()


def metrics_of(history):
    events, trial = history
    return trial_metrics(events_frame(events), trial)


def test_a_killed_trial_is_incomplete_and_says_where_it_ended():
    row = metrics_of(killed_during_the_fault())
    assert row["outcome"] == "incomplete"
    assert row["outcome_reason"].startswith("no trial_end: the trial did not finish (while running the "
                                            "fault timeline, last event step on r3 12.")


def test_an_incomplete_trial_is_not_judged_against_its_expectation(tmp_path):
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": killed_during_the_fault()})
    row = analyze_run(run_dir).iloc[0]
    assert row["outcome"] == "incomplete"
    assert pd.isna(row["expect_ok"]) and row["expect_failures"] == ""
    [cells] = table_rows(analyze_run(run_dir))
    assert cells[-1] == "not judged: the trial did not finish"
    assert cells[6] == "-" and "inconclusive" not in " ".join(cells)


def test_a_trial_the_harness_stopped_on_an_error_is_incomplete_not_crashed(tmp_path):
    # it was once judged "crashed" and failed its detect_within on a fault never applied
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": a_rank_gone_in_warm_up()})
    row = analyze_run(run_dir).iloc[0]
    assert row["outcome"] == "incomplete"
    assert row["outcome_reason"].startswith("the harness stopped the trial on an error (while watching the "
                                            "ranks, last event rank_exited on r3 6.")
    assert pd.isna(row["expect_ok"]) and row["expect_failures"] == ""


def test_chaos_report_says_the_run_is_incomplete(tmp_path, capsys):
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": killed_during_the_fault(),
                                                 "retry": fakes.recovered()})
    shutil.rmtree(run_dir / "trials" / "retry")  # killed before the second trial began
    assert report_main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "INCOMPLETE: trial timeout: no trial_end: the trial did not finish (while running" in printed
    assert "INCOMPLETE: never began: retry (listed in run.json, no trial.json)" in printed


def test_a_trial_folder_without_trial_json_never_began(tmp_path, capsys):
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": fakes.recovered(), "retry": fakes.recovered()})
    (run_dir / "trials" / "retry" / "trial.json").unlink()  # killed between mkdir and trial.json
    assert report_main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
    assert "INCOMPLETE: never began: retry (listed in run.json, no trial.json)" in capsys.readouterr().out
    assert list(analyze_run(run_dir)["trial"]) == ["timeout"]


def test_a_complete_run_prints_no_incomplete_line(tmp_path, capsys):
    run_dir = fakes.write_run(tmp_path / "run", {"retry": fakes.recovered()})
    assert report_main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
    assert "INCOMPLETE" not in capsys.readouterr().out


def test_every_fault_of_a_timeline_has_its_own_figures():
    row = metrics_of(two_faults())
    assert (row["f0_fault"], row["f1_fault"]) == ("link_down", "link_down")
    assert (row["f0_targets"], row["f1_targets"]) == ("1", "2")
    assert row["f1_start_s"] == 10.0
    assert math.isnan(row["f0_ttd_s"]) and row["f0_detect_ranks"] == 0  # the first was absorbed
    assert math.isnan(row["f0_ttr_s"])
    assert row["f1_ttd_s"] == 1.5 and row["f1_detect_ranks"] == fakes.RANKS
    assert abs(row["f1_ttr_s"] - 4.003) < 1e-9  # r3's first step at 24.003 s, 20 s fault start
    assert math.isnan(row["f1_breaker_open_s"])
    # the first fault's columns are kept as they were: measured from the first fault's start
    assert row["ttd_s"] == 11.5 and row["fault"] == "link_down"


def test_the_table_lists_every_fault():
    frame = pd.DataFrame([metrics_of(two_faults())])
    assert fault_rows(frame) == [
        ["retry", "0", "link_down on r1", "+0.0 s", "not observed", "not observed", "not observed"],
        ["retry", "1", "link_down on r2", "+10.0 s", "1.5 s", "4.0 s", "not observed"]]
    assert "Every fault, each timed from its own start" in format_table(frame)


def test_one_fault_adds_no_fault_table():
    frame = pd.DataFrame([metrics_of(fakes.recovered())])
    assert "Every fault" not in format_table(frame)


def test_the_html_report_lists_every_fault_as_the_markdown_one_does(tmp_path):
    run_dir = fakes.write_run(tmp_path / "run", {"retry": two_faults(), "timeout": fakes.recovered()})
    written = write_reports(run_dir)
    page = written[REPORT_HTML].read_text()
    assert "Every fault, each timed from its own start" in page
    assert "<td>link_down on r2</td><td>+10.0 s</td><td>1.5 s</td><td>4.0 s</td>" in page
    assert "Every fault, each timed from its own start" in written[REPORT_MARKDOWN].read_text()


def test_the_plot_labels_every_fault_with_its_figures():
    events, trial = two_faults()
    frame = events_frame(events)
    labels = timeline_figure(frame, "t", trial_metrics(frame, trial)).axes[0].get_legend_handles_labels()[1]
    assert "#0 link_down" in labels
    assert "#1 link_down: detect 1.5 s, recover 4.0 s" in labels


def test_the_trial_s_fault_is_the_first_applied_not_the_first_listed():
    """Found by `chaos explore` (elastic): a fault anchored on an event, listed first, came
    after a link down listed second; every rank detected the link down, and the trial read
    inconclusive ("0 ranks detected the fault") as its detections were counted from the
    anchored one's start."""
    h = fakes.History(policy="retry", timeout=1.5)
    h.steps(0.0, fakes.FAULT_AT)
    h.fault(targets=(2,), start=fakes.FAULT_AT, end=13.0, index=1)
    h.each(None, 11.5, "collective_error", step=60, gen=0, phase="step", cause="timeout", error="Timed out")
    h.each(None, 13.9, "restored", step=60, gen=1, source="checkpoint")
    h.fault(kind="read_only", targets=(3,), start=13.95, end=20.0, index=0)  # on the new generation
    h.steps(14.0, 30.0, gen=1)
    h.end(30.0, survivors=list(range(fakes.RANKS)))
    row = metrics_of(h.done())
    assert row["outcome"] == "recovered" and row["fault"] == "link_down" and row["ttd_s"] == 1.5
    assert abs(row["f0_start_s"] - 3.95) < 1e-9 and row["f1_start_s"] == 0.0
