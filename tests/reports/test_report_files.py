"""Round trip: a synthetic run folder -> report files, and the `chaos report` entry point."""
from __future__ import annotations

import json
import math

import pandas as pd

import report_fakes as fakes
from reports import analyze_run, compare_runs, expectation_failures, report_main, write_reports


def make_run(tmp_path, name="run-a", seed=7):
    return fakes.write_run(tmp_path / name, {"baseline": fakes.hung(), "timeout": fakes.failed_fast(),
                                             "retry": fakes.recovered(), "isolation": fakes.isolated()},
                           seed=seed)


def test_analyze_run_one_row_per_trial_in_policy_order(tmp_path):
    run_dir = make_run(tmp_path)
    df = analyze_run(run_dir)
    assert list(df["trial"]) == ["baseline", "timeout", "retry", "isolation"]
    assert list(df["outcome"]) == ["hung", "failed-fast", "recovered", "isolated"]
    assert set(df["scenario"]) == {"link-down-r1"}
    assert list(run_dir.iterdir()) and not (run_dir / "metrics.csv").exists()  # writes nothing


def test_expectation_verdicts_in_the_row(tmp_path):
    timeout = fakes.expecting(fakes.failed_fast(), outcome=("failed-fast",), detect_within=5.0)
    hung = fakes.expecting(fakes.hung(), outcome=("recovered",), recover_within=12.0)
    recovered = fakes.expecting(fakes.recovered(), outcome=("recovered",))
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": timeout, "baseline": hung, "retry": recovered})
    table = analyze_run(run_dir)
    row = table.set_index("trial").loc["timeout"]
    assert bool(row["expect_ok"]) is False  # bool() of NA (no expectation) would raise
    assert row["expect_failures"] == "detect_within 5 s: time to detect 5.10 s"
    assert json.loads(row["expect"]) == {"detect_within": 5.0, "outcome": ["failed-fast"]}
    assert expectation_failures(table) == [
        "timeout: detect_within 5 s: time to detect 5.10 s",
        "baseline: outcome: expected recovered, measured hung",
        "baseline: recover_within 12 s: time to recover nothing measured: hung >= 30 s",
    ]


def test_write_reports_round_trip(tmp_path):
    run_dir = make_run(tmp_path)
    written = write_reports(run_dir)
    assert set(written) == {"metrics.csv", "report.md", "report.html", "plots/comparison.png",
                            "plots/timeline-baseline.png", "plots/timeline-timeout.png", "plots/timeline-retry.png",
                            "plots/timeline-isolation.png"}
    assert all(path == run_dir / name and path.is_file() for name, path in written.items())
    assert written["plots/timeline-retry.png"].read_bytes().startswith(b"\x89PNG")

    csv = pd.read_csv(written["metrics.csv"])
    assert len(csv) == 4
    baseline = csv.set_index("trial").loc["baseline"]
    assert baseline["hung_cap"] == 30 and math.isnan(baseline["ttd_s"])
    assert "NaN" in written["metrics.csv"].read_text()

    md = written["report.md"].read_text()
    assert md.index("![the policies compared](plots/comparison.png)") < md.index("| policy | fault |")
    assert "| policy | fault | what happened (measured) |" in md
    assert "hung >= 30 s" in md and "wasted rank-seconds" in md
    assert "(plots/timeline-retry.png)" in md

    html = written["report.html"].read_text()
    assert html.count("data:image/png;base64,") == 5  # the policies compared, then each timeline
    assert html.index("alt='the policies compared'") < html.index("<table>")  # on the first screen
    assert "<img" in html and "src='plots/" not in html  # self-contained
    assert "link-down-r1" in html and "Definitions" in html


def test_write_reports_to_another_folder_leaves_the_run_untouched(tmp_path):
    run_dir = make_run(tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    written = write_reports(run_dir, tmp_path / "out")
    assert written["report.html"] == tmp_path / "out" / "report.html"
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_compare_runs(tmp_path):
    text = compare_runs([make_run(tmp_path, "run-a", 1), make_run(tmp_path, "run-b", 2)])
    assert "| policy | fault | run-a (seed 1) | run-b (seed 2) |" in text
    assert "| retry | link_down | recovered, recover 8.0 s | recovered, recover 8.0 s |" in text


def test_report_main_writes_and_prints_the_table(tmp_path, capsys):
    run_dir = make_run(tmp_path)
    assert report_main([str(run_dir), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "| baseline | link_down on r1 | r1 link_down -> no rank detects it" in out
    assert (tmp_path / "out" / "report.html").is_file()


def test_report_main_several_runs_one_folder_each(tmp_path, capsys):
    runs = [make_run(tmp_path, "run-a"), make_run(tmp_path, "run-b")]
    assert report_main([*map(str, runs), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "run-a" / "metrics.csv").is_file()
    assert (tmp_path / "out" / "run-b" / "report.md").is_file()
    assert (tmp_path / "out" / "compare.md").is_file()
    assert "# Runs compared" in capsys.readouterr().out


def test_report_main_missing_dir_is_one_line_and_exit_2(tmp_path, capsys):
    assert report_main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope: no such run folder" in err


def test_report_main_not_a_run_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run.json: missing" in err


def test_report_main_usage_error_is_one_line(capsys):
    assert report_main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("chaos report: error:")


def test_report_main_nothing_written_when_one_run_is_bad(tmp_path, capsys):
    run_dir = make_run(tmp_path)
    assert report_main([str(run_dir), str(tmp_path / "nope")]) == 2
    assert not (run_dir / "report.html").exists()


def test_the_comparison_draws_each_policy_s_times_its_claim_and_a_hang_as_at_least_the_cap(tmp_path):
    from reports.plots import comparison_figure
    from reports.tables import claim_marks
    df = analyze_run(make_run(tmp_path))
    ax = comparison_figure(df, claim_marks()).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "baseline\nhung", "timeout\nfailed-fast", "retry\nrecovered", "isolation\nisolated"]
    texts = [t.get_text() for t in ax.texts]
    assert ">= 30 s (cap)" in texts  # the baseline hung: drawn to the cap, said as at least it
    assert "document: stuck ~5.2 h >" in texts  # its claim is past the axis: written at the edge
    row = df.set_index("trial").loc["retry"]
    assert f"{row['ttr_s']:.2f} s" in texts and f"{row['ttd_s']:.2f} s" in texts
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert set(legend) >= {"detect", "recover", "breaker open", "hung: at least the cap", "the document's claim"}


def test_a_crash_s_why_names_the_cause_from_the_log_of_the_rank_that_died_first(tmp_path):
    """The exit says that a rank crashed; its log says why (reports.last_error). r2 died first."""
    events, trial = fakes.crashed()
    for e in events:
        if e["kind"] in ("exit", "rank_exited") and e["rank"] != 2:
            e["t"] += 0.05
    run_dir = fakes.write_run(tmp_path / "run", {"baseline": (events, trial)})
    logs = run_dir / "trials" / "baseline" / "logs"
    logs.mkdir()
    (logs / "r001.log").write_text("Traceback (most recent call last):\nOSError: [Errno 5] Input/output error\n")
    (logs / "r002.log").write_text("step 39\nTraceback (most recent call last):\n"
                                   "RuntimeError: Timed out waiting 5000ms for recv operation to complete\n")
    row = analyze_run(run_dir).iloc[0]
    assert row["outcome"] == "crashed" and row["crash_order"].split()[0] == "2"
    cause = "r2: RuntimeError: Timed out waiting 5000ms for recv operation to complete"
    assert row["crash_cause"] == cause
    md = write_reports(run_dir)["report.md"].read_text()
    assert f"the log: {cause}" in md
