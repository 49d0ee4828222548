"""Pure analysis of stored runs: a run folder's event files -> metrics, verdicts, reports.

Imports neither `chaos` nor `harness`, so any stored run can be re-analyzed without
re-running it. A run folder, as the orchestrator writes it:

    RUN_DIR/run.json            scenario, scenario_file, seed, backend, policies, started_wall,
                                command, clock ("monotonic (one kernel)")
    RUN_DIR/scenario.yaml       a copy of the scenario
    RUN_DIR/trials/<policy>/trial.json
                                policy, policy_spec, run_id, backend, ranks, hang_cap,
                                mono_anchor, wall_anchor, faults [{index, kind, fault, targets,
                                start, duration}], expect {outcome, detect_within,
                                recover_within, breaker_within} or null
    RUN_DIR/trials/<policy>/events.jsonl
                                one JSON event per line (schema: runfolder/events.py); t is
                                monotonic seconds shared by every process of the trial
    RUN_DIR/trials/<policy>/logs/rNNN.log

What the reports write (into RUN_DIR, or --out DIR):

    metrics.csv                 one row per trial, every metric a column (seconds; NaN where
                                a metric does not apply; a hang has `hung_cap`, no fake time)
    report.md, report.html      the comparison with the source document's table, per-trial
                                metrics and timelines, the definitions (report.html is
                                self-contained: plots embedded as base64 PNG)
    plots/timeline-<trial>.png  step index of every rank over time around the fault

Definitions of every metric and the outcome rules: `reports.metrics`.
"""
from reports.analysis import analyze_run
from reports.cli import report_main
from reports.expect import check_expectations, expectation_failures
from reports.history import RunFolderError
from reports.metrics import OUTCOMES, trial_metrics
from reports.tables import format_table
from reports.writer import compare_runs, write_reports

__all__ = ["OUTCOMES", "RunFolderError", "analyze_run", "check_expectations", "compare_runs",
           "expectation_failures", "format_table", "report_main", "trial_metrics", "write_reports"]
