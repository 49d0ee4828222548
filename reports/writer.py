"""Report files of one run (metrics.csv, report.md, self-contained report.html, timeline PNGs)
and the side-by-side comparison of several runs."""
from __future__ import annotations

import base64
import html
import math
import os
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from reports import metrics as metric_definitions
from reports.analysis import incomplete_text, run_frame, run_label
from reports.history import RunRecord, load_run
from reports.plots import comparison_png, timeline_png
from reports.tables import (EVERY_FAULT, FAULT_COLUMNS, TABLE_COLUMNS, claim_marks, compare_table, fault_rows,
                            format_table,
                            markdown_table, several_faults, table_rows)
from runfolder.info import RunInfo
from reports.stuck import read_stacks
from runfolder.layout import (COMPARISON_PLOT, METRICS_FILE, PLOTS_DIR, REPORT_HTML, REPORT_MARKDOWN, STACKS_DIR,
                              plot_file)

# (column, label) of the per-trial summary; every column is in metrics.csv
KEY_METRICS: tuple[tuple[str, str], ...] = (
    ("outcome", "outcome"),
    ("outcome_reason", "why"),
    ("crash_cause", "a crash's cause: the last error lines of the first crashed rank's log (reports.last_error)"),
    ("not_applied", "faults not applied (their rank had exited, or their event never came)"),
    ("checkpoints", "checkpoints loaded from before the trial or from another trial (reports.checkpoints)"),
    ("state", "state (reports.state)"),
    ("state_detail", "state: what it rests on"),
    ("storage", "under a storage fault, the checkpoint invariants (reports.storage)"),
    ("stragglers", "under a slow or step_delay fault, the straggler detectors against the slowed ranks "
                   "(reports.straggler)"),
    ("trajectory", "trajectory against a fault-free run (reports.trajectory)"),
    ("trajectory_detail", "trajectory: what it rests on"),
    ("stuck_in", "stuck in, at the hang cap (reports.stuck)"),
    ("at_detect", "where the processes were at each fault's first detection (reports.stuck)"),
    ("ttd_s", "time to detect, first rank (s)"),
    ("detect_first_rank", "first rank to detect"),
    ("ttd_median_s", "time to detect, median rank (s)"),
    ("ttd_max_s", "time to detect, last rank (s)"),
    ("detect_ranks", "ranks that detected"),
    ("ttr_s", "time to recover from fault start (s)"),
    ("ttr_after_end_s", "time to recover from fault end (s)"),
    ("breaker_open_s", "breaker open (s)"),
    ("released_s", "resources released, processes gone (s)"),
    ("hung_cap", "hung at least (s, the harness cap)"),
    ("wasted_rank_s", "wasted rank-seconds"),
    ("waste_gap_threshold_s", "waste gap threshold (s)"),
    ("max_stall_s", "longest stall of a rank (s)"),
    ("steps_per_s_before", "steps/s before"),
    ("steps_per_s_during", "steps/s during"),
    ("steps_per_s_after", "steps/s after"),
    ("retries", "retries (most on one rank)"),
    ("restarts", "rank processes started again after fault start (n/a: not observed)"),
    ("heals", "replica groups healed live from a peer after fault start (a framework's; n/a: not observed)"),
    ("heal_detail", "heals: from whom, when, and the steps each took up"),
    ("generations", "process-group generations"),
    ("steps_rolled_back", "steps rolled back by the restore"),
    ("steps_repeated", "steps run again after a resume (all ranks)"),
    ("departed", "ranks that left"),
    ("observed_s", "observed after fault start (s)"),
)


def _value(value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _summary_rows(row: Mapping[str, Any]) -> list[list[str]]:
    return [[label, _value(row.get(column))] for column, label in KEY_METRICS]


def _meta_lines(run: RunRecord) -> list[tuple[str, str]]:
    keys = ("scenario", "seed", "backend", "started_wall", "clock", "command")
    commit = run.info.harness_commit or (f"not recorded (run folder format {run.info.format_version}, from before "
                                         "it was)" if run.info.format_version < 23 else "not a git checkout")
    return ([(k, str(getattr(run.info, k))) for k in keys] + [("harness commit", commit)]
            + [("machine", machine_text(run.info))] + [("run folder", str(run.path))])


def machine_text(info: RunInfo) -> str:
    """How fast the machine was as the run began, to read its times against."""
    if info.machine is not None:
        return info.machine.describe()
    if info.format_version < 2:
        return f"not recorded (run folder format {info.format_version}, from before it was)"
    return "not measured (on Kubernetes, the cluster's nodes are not; else the run's progress said why)"


def _definitions() -> str:
    text = metric_definitions.__doc__ or ""
    return text[text.index("Definitions"):].strip() if "Definitions" in text else text.strip()


def stack_links(run: RunRecord, out_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Per trial, (label, path relative to out_dir) of every process's full stacks."""
    links: dict[str, list[tuple[str, str]]] = {}
    for trial in run.trials:
        for process in read_stacks(trial.path) or ():
            name = f"r{process.rank:03d}-{process.pid}.json"
            if (trial.path / STACKS_DIR / name).is_file():
                path = os.path.relpath(trial.path / STACKS_DIR / name, out_dir)
                links.setdefault(trial.name, []).append((f"rank {process.rank} {process.role} {process.pid}", path))
    return links


def markdown_report(run: RunRecord, df: pd.DataFrame, plots: Mapping[str, str],
                    stacks: Mapping[str, list[tuple[str, str]]] | None = None) -> str:
    """report.md; `plots` maps a trial to its PNG path relative to the report."""
    out = [f"# Chaos run: {run.info.scenario}", ""]
    out += [f"- {key}: {value}" for key, value in _meta_lines(run)]
    out += ["", f"![the policies compared]({COMPARISON_PLOT})", ""]
    out += ["## Measured against the source document", "", incomplete_text(run, df) + format_table(df), "",
            "## Trials", ""]
    for _, row in df.iterrows():
        out += [f"### {row['trial']}: {row['outcome']}", "", markdown_table(("metric", "value"), _summary_rows(row)), ""]
        if row["trial"] in plots:
            out += [f"![timeline of {row['trial']}]({plots[row['trial']]})", ""]
        if (stacks or {}).get(row["trial"]):
            out += ["Full stacks: " + ", ".join(f"[{label}]({path})" for label, path in stacks[row["trial"]]), ""]
    out += ["## Definitions", "", "```", _definitions(), "```", ""]
    return "\n".join(out)


def _html_table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}"
          "table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #bbb;padding:4px 8px;vertical-align:top;text-align:left}"
          "th{background:#eee}img{max-width:100%}pre{background:#f6f6f6;padding:1em}")


def _png(data: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"


def html_report(run: RunRecord, df: pd.DataFrame, pngs: Mapping[str, bytes], comparison: bytes,
                stacks: Mapping[str, list[tuple[str, str]]] | None = None) -> str:
    """report.html: self-contained, the pictures embedded as base64 PNG; the policies
    compared on the first screen."""
    title = html.escape(f"Chaos run: {run.info.scenario}")
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
           f"<style>{_STYLE}</style></head><body><h1>{title}</h1>", _png(comparison, "the policies compared"),
           _html_table(("", ""), [[k, v] for k, v in _meta_lines(run)]),
           "<h2>Measured against the source document</h2>", _html_table(TABLE_COLUMNS, table_rows(df))]
    if several_faults(df):
        out += [f"<h3>{EVERY_FAULT}</h3>", _html_table(FAULT_COLUMNS, fault_rows(df))]
    out.append("<h2>Trials</h2>")
    for _, row in df.iterrows():
        out += [f"<h3>{html.escape(str(row['trial']))}: {html.escape(str(row['outcome']))}</h3>",
                _html_table(("metric", "value"), _summary_rows(row))]
        if row["trial"] in pngs:
            out.append(_png(pngs[row["trial"]], f"timeline of {row['trial']}"))
        if (stacks or {}).get(row["trial"]):
            out.append("<p>Full stacks: " + ", ".join(f"<a href='{html.escape(path)}'>{html.escape(label)}</a>"
                                                      for label, path in stacks[row["trial"]]) + "</p>")
    if run.scenario_text:
        out.append(f"<h2>Scenario</h2><pre>{html.escape(run.scenario_text)}</pre>")
    out += [f"<h2>Definitions</h2><pre>{html.escape(_definitions())}</pre>", "</body></html>"]
    return "\n".join(out)


def write_run_reports(run: RunRecord, df: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Write the report files of `run`, whose metrics rows are `df`, into `out_dir`."""
    (out_dir / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes | str] = {}
    pngs: dict[str, bytes] = {}
    plots: dict[str, str] = {}
    for trial, (_, row) in zip(run.trials, df.iterrows(), strict=True):
        plots[trial.name] = plot_file(trial.name)
        pngs[trial.name] = files[plots[trial.name]] = timeline_png(trial.events, f"{trial.name}: {row['outcome']}", row)
    files[COMPARISON_PLOT] = comparison = comparison_png(df, claim_marks())
    files[METRICS_FILE] = df.to_csv(index=False, na_rep="NaN", float_format="%.6g")
    stacks = stack_links(run, out_dir)
    files[REPORT_MARKDOWN] = markdown_report(run, df, plots, stacks)
    files[REPORT_HTML] = html_report(run, df, pngs, comparison, stacks)
    written = {}
    for name, content in files.items():
        written[name] = out_dir / name
        if isinstance(content, bytes):
            written[name].write_bytes(content)
        else:
            written[name].write_text(content)
    return written


def report_run(run_dir: Path, out_dir: Path | None = None) -> tuple[pd.DataFrame, dict[str, Path]]:
    """Analyze a stored run once and write its reports from that analysis: the table (one
    row per trial, as `analyze_run` gives it) and the written paths (as `write_reports`)."""
    run = load_run(Path(run_dir))
    out = Path(out_dir) if out_dir is not None else run.path
    out.mkdir(parents=True, exist_ok=True)
    frame = run_frame(run)
    return frame, write_run_reports(run, frame, out)


def write_reports(run_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """Write metrics.csv, report.md, report.html and plots/timeline-<trial>.png for a stored
    run, into `out_dir` (default: the run folder). Returns the written paths, keyed by their
    path relative to `out_dir` ("report.md", "plots/timeline-retry.png", ...)."""
    return report_run(run_dir, out_dir)[1]


def compare_markdown(runs: list[tuple[RunRecord, pd.DataFrame]]) -> str:
    table = compare_table([(run_label(run), df) for run, df in runs])
    return "\n".join(["# Runs compared", "",
                      *[f"- {run_label(r)}: {r.path}; machine: {machine_text(r.info)}" for r, _ in runs],
                      "", table, ""])


def compare_runs(run_dirs: list[Path]) -> str:
    """Markdown: several runs side by side, one column per run, one row per policy and fault."""
    runs = [load_run(Path(d)) for d in run_dirs]
    return compare_markdown([(run, run_frame(run)) for run in runs])
