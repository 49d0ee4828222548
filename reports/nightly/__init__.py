"""The analysis side of a chaos night: repeated trials -> history, figures with spread, the
regression gate, and the files CI systems read. Pure analysis like the rest of `reports`:
its input is the rows `reports.analyze_run` returns for each run folder of the night.

    runs = [NightRun(repeat, command, reports.analyze_run(run_dir)), ...]
    append_night(DB, night_history(NightInfo(night, started, commit=..., ...), runs))
    history = read_history(DB)
    report = night_report(history, night, numpy.random.default_rng(seed))
    write_night_files(NIGHT_DIR, history, report)   # junit.xml summary.md metrics.prom trends.html
    report.gate.passed                               # False: name report.gate.regressions, exit 1

Modules: campaign (a night's campaign cell as rows, its ETTR bars), stats (median, IQR, bootstrap interval, counts, rank-sum test), history (the
SQLite database and the metrics it keeps), summary (a night per scenario x policy), gate
(the regression rules), document (the source document's table row by row), outputs (JUnit,
Markdown, Prometheus, the night's files), trends (the trend page).
"""
from reports.nightly.campaign import EttrBar, campaign_trials, judge_ettr
from reports.nightly.document import ClaimCheck, document_checks, document_table
from reports.nightly.gate import GateResult, GateRules, Regression, check_gate
from reports.nightly.history import (NIGHTLY_METRICS, History, HistoryError, Metric, NightConflict, NightInfo,
                                     NightRun, append_night, night_history, read_history)
from reports.nightly.outputs import (NightReport, junit_xml, markdown_summary, night_registry, night_report,
                                     write_night_files)
from reports.nightly.summary import PolicyNight, summarize_night
from reports.nightly.trends import trend_html

__all__ = ["NIGHTLY_METRICS", "ClaimCheck", "EttrBar", "campaign_trials", "judge_ettr", "GateResult", "GateRules", "History", "HistoryError", "Metric",
           "NightConflict", "NightInfo", "NightReport", "NightRun", "PolicyNight", "Regression", "append_night",
           "check_gate", "document_checks", "document_table", "junit_xml", "markdown_summary", "night_history",
           "night_registry", "night_report", "read_history", "summarize_night", "trend_html", "write_night_files"]
