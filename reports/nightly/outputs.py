"""What CI systems read of a night: JUnit XML, a Markdown summary, a Prometheus text file,
and the trend page; write_night_files writes all four into the night folder.

  junit.xml      one test case per scenario x policy (classname the scenario, name the
                 policy); every figure a property; a failure when the gate found a
                 regression in it or a repeat missed the scenario's expectation
  summary.md     the gate's verdict, the source document's table row by row, and one line per
                 scenario x policy: small enough for a CI job summary (no images)
  metrics.prom   the night's figures as Prometheus gauges (for node_exporter's textfile
                 collector: written to a temporary file and renamed)
  trends.html    reports.nightly.trends
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, Info, write_to_textfile

from reports.nightly.document import ClaimCheck, document_checks, document_table
from reports.nightly.gate import DEFAULT_RULES, GateResult, GateRules, check_gate
from reports.nightly.history import MACHINE_FIELDS, MACHINE_FIGURES, NIGHT_FIELDS, NIGHTLY_METRICS, History, NightInfo
from reports.nightly.summary import PolicyNight, summarize_night
from reports.nightly.trends import TREND_NIGHTS, trend_html
from reports.tables import markdown_table

# (column, heading) of the per-policy table of the summary
SUMMARY_FIGURES = (("ttd_s", "time to detect"), ("ttr_s", "time to recover"),
                   ("breaker_open_s", "breaker open"), ("wasted_rank_s", "wasted rank-seconds"),
                   ("ettr_pct", "ETTR (campaign)"))
QUANTILES = (("0.25", "q1"), ("0.5", "median"), ("0.75", "q3"))


@dataclass(frozen=True)
class NightReport:
    """Everything the night's files say, computed once."""

    info: NightInfo
    policies: tuple[PolicyNight, ...]
    claims: tuple[ClaimCheck, ...]
    gate: GateResult


def night_report(history: History, night: str, rng: np.random.Generator,
                 rules: GateRules = DEFAULT_RULES) -> NightReport:
    """The night `night` of `history` (already appended); `rng` drives the bootstrap intervals."""
    policies = summarize_night(history, night, rng)
    return NightReport(info=history.info(night), policies=policies,
                       claims=document_checks(history, night, policies), gate=check_gate(history, night, rules))


def _failures(report: NightReport, policy: PolicyNight) -> list[str]:
    regressions = [r.text() for r in report.gate.regressions
                   if (r.scenario, r.policy) == (policy.scenario, policy.policy)]
    return regressions + [f"expectation: {line}" for line in policy.expect_failures]


def junit_xml(report: NightReport) -> str:
    suite = ET.Element("testsuite", name=f"chaos nightly {report.info.night}", timestamp=report.info.started,
                       tests=str(len(report.policies)),
                       failures=str(sum(bool(_failures(report, p)) for p in report.policies)))
    for policy in report.policies:
        case = ET.SubElement(suite, "testcase", classname=policy.scenario, name=policy.policy)
        properties = ET.SubElement(case, "properties")
        named = [("outcomes", policy.outcome_text()), ("expectations", policy.expectation_text())]
        for figure in policy.figures:
            q = figure.quartiles
            named += [(figure.metric.column, figure.text()), (f"{figure.metric.column}.n", str(q.n)),
                      *((f"{figure.metric.column}.{name}", f"{getattr(q, name):.6g}") for _, name in QUANTILES)]
        for name, value in named:
            ET.SubElement(properties, "property", name=name, value=value)
        failures = _failures(report, policy)
        if failures:
            more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
            failure = ET.SubElement(case, "failure", message=failures[0] + more, type="chaos-nightly")
            failure.text = "\n".join(failures)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _gate_lines(gate: GateResult) -> list[str]:
    if gate.passed:
        head = f"**passed**: {gate.judged} comparisons with earlier nights, no regression"
    else:
        head = f"**FAILED**: {len(gate.regressions)} regression(s) in {gate.judged} comparisons"
    lines = [head, *([""] if gate.regressions else []), *(f"- {r.text()}" for r in gate.regressions)]
    if gate.machine:
        lines += ["", f"Note: {gate.machine}."]
    if gate.unjudged:
        lines += ["", f"{len(gate.unjudged)} not judged (too little history):",
                  *(f"- {line}" for line in gate.unjudged)]
    return lines


def markdown_summary(report: NightReport) -> str:
    info = report.info
    meta = [f"{name} {value}" for name, value in asdict(info).items()
            if value and name != "night" and name not in MACHINE_FIELDS]
    if machine := info.machine_text():
        meta.append(f"machine: {machine}")
    rows = []
    for policy in report.policies:
        figures = [policy.figure(column) for column, _ in SUMMARY_FIGURES]
        rows.append([policy.scenario, policy.policy, policy.fault or "none", policy.outcome_text(),
                     *(f.text() if f is not None else "-" for f in figures), policy.expectation_text()])
    header = ["scenario", "policy", "fault", "outcomes", *(heading for _, heading in SUMMARY_FIGURES), "expectations"]
    out = [f"# Chaos nightly {info.night}", "", "; ".join(meta), "", "## Gate", "", *_gate_lines(report.gate), "",
           "## The source document's table, measured", "", document_table(report.claims), "",
           "## Every scenario x policy", "", markdown_table(header, rows), "",
           "Figures: median (IQR q1-q3, 95% bootstrap CI of the median, n repeats).", ""]
    return "\n".join(out)


def night_registry(report: NightReport) -> CollectorRegistry:
    """The night's figures as gauges: quartiles per metric, trials per outcome, the gate."""
    registry = CollectorRegistry()
    labels = ["scenario", "policy"]
    Info("chaos_nightly", "the night's run metadata", registry=registry).info(
        {name: getattr(report.info, name) for name in NIGHT_FIELDS if name not in MACHINE_FIELDS})
    for name, (what, unit) in MACHINE_FIGURES.items():
        if (value := getattr(report.info, name)) is not None:
            Gauge(f"chaos_nightly_machine_{name}", f"{what} ({unit}) as the night began (harness/trial/machine.py)",
                  registry=registry).set(value)
    Gauge("chaos_nightly_started_timestamp_seconds", "when the night started (Unix time)",
          registry=registry).set(report.info.started_at.timestamp())
    trials = Gauge("chaos_nightly_trials", "trials of the night by outcome", [*labels, "outcome"], registry=registry)
    gauges = {m.column: Gauge(m.gauge, f"{m.label} ({m.unit}): quartiles over the night's repeats",
                              [*labels, "quantile"], registry=registry) for m in NIGHTLY_METRICS}
    samples = Gauge("chaos_nightly_samples", "repeats that measured the metric", [*labels, "metric"],
                    registry=registry)
    for policy in report.policies:
        key = {"scenario": policy.scenario, "policy": policy.policy}
        for outcome, count in policy.outcomes.counts:
            trials.labels(**key, outcome=outcome).set(count)
        for figure in policy.figures:
            for quantile, name in QUANTILES:
                gauges[figure.metric.column].labels(**key, quantile=quantile).set(getattr(figure.quartiles, name))
            samples.labels(**key, metric=figure.metric.column).set(figure.quartiles.n)
    regressions = Gauge("chaos_nightly_regressions", "regressions the gate found", [*labels, "metric"],
                        registry=registry)
    for regression in report.gate.regressions:
        regressions.labels(scenario=regression.scenario, policy=regression.policy, metric=regression.metric).set(1)
    Gauge("chaos_nightly_gate_passed", "1 when the gate found no regression", registry=registry).set(
        int(report.gate.passed))
    return registry


def write_night_files(out_dir: Path, history: History, report: NightReport,
                      trend_nights: int = TREND_NIGHTS) -> dict[str, Path]:
    """Write junit.xml, summary.md, metrics.prom and trends.html into `out_dir`; returns them by name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {name: out_dir / name for name in ("junit.xml", "summary.md", "metrics.prom", "trends.html")}
    written["junit.xml"].write_text(junit_xml(report))
    written["summary.md"].write_text(markdown_summary(report))
    write_to_textfile(str(written["metrics.prom"]), night_registry(report))
    written["trends.html"].write_text(trend_html(history, report.info.night, trend_nights))
    return written
