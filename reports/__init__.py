"""Pure analysis of stored runs: a run folder's event files -> metrics, verdicts, reports.

Reads run folders only through the run-folder contract (`runfolder`: their layout, run.json
and trial.json with the trial's plan, the event kinds), and imports neither `chaos` nor
`harness`, so any stored run can be re-analyzed without re-running it. A folder the contract
cannot read (written before run folders carried a format_version, or by a newer
chaos-harness) is refused with one line naming the file, the problem and the fix.

What the reports write (into RUN_DIR, or --out DIR; names in runfolder.layout):

    metrics.csv                 one row per trial, every metric a column (seconds; NaN where
                                a metric does not apply; a hang has `hung_cap`, no fake time)
    report.md, report.html      the comparison with the source document's table, per-trial
                                metrics and timelines, the definitions (report.html is
                                self-contained: plots embedded as base64 PNG)
    plots/timeline-<trial>.png  step index of every rank over time around the fault

Definitions of every metric and the outcome rules: `reports.metrics`. Each trial is judged
against the expectation its stored plan holds (`reports.expect`): the one verdict.
"""
from reports.analysis import analyze_run
from reports.cli import report_main
from reports.expect import check_expectations, expectation_failures, trial_failures
from reports.metrics import trial_metrics
from reports.tables import format_table
from reports.writer import compare_runs, report_run, write_reports
from runfolder.info import RunFolderError

__all__ = ["RunFolderError", "analyze_run", "check_expectations", "compare_runs", "expectation_failures",
           "format_table", "report_main", "report_run", "trial_failures", "trial_metrics", "write_reports"]
