"""A stored run -> one metrics row per trial, with the verdict on its plan's expectation.

An incomplete trial (no trial_end) is not judged against its expectation: the run stopped
before the trial could show what it was expected to show. An incomplete run (a trial that
run.json lists but that never began) is named by `missing_trials`."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from reports.checkpoints import foreign_loads, saved, shared_checkpoint_failure
from reports.expect import FAILURE_SEPARATOR, check_expectations, expectation_json
from reports.history import RunRecord, TrialRecord, load_run
from reports.last_error import crash_cause
from reports.metrics import trial_metrics
from reports.stuck import detect_summary, read_flight, read_stacks, stuck_summary
from reports.trajectory import check_trajectory, read_reference


def run_label(run: RunRecord) -> str:
    return f"{run.path.name} (seed {run.info.seed})"


def trial_row(run: RunRecord, trial: TrialRecord) -> dict[str, Any]:
    metrics = trial_metrics(trial.events, trial.info)
    t0 = metrics["fault_start_t"] if not math.isnan(metrics["fault_start_t"]) else 0.0
    records = trial.events.to_dict("records")
    metrics["stuck_in"] = stuck_summary(read_stacks(trial.path), records, trial.info.plan.ranks, t0,
                                        read_flight(trial.path))
    metrics["at_detect"] = detect_summary(trial.path, records, trial.info.plan.ranks, t0)
    metrics["crash_cause"] = crash_cause(trial.path, [int(r) for r in metrics["crash_order"].split()])
    trajectory = check_trajectory(records, read_reference(run.path) if trial.info.plan.job is None else None)
    metrics["trajectory"], metrics["trajectory_detail"] = trajectory.verdict, trajectory.detail
    job = trial.info.plan.job
    others = [(other.name, saved(other.events)) for other in run.trials if other is not trial]
    findings = foreign_loads(trial.events, trial.info, others) if job is not None else []
    metrics["checkpoints"] = "; ".join(findings)
    expect = trial.info.plan.expect if metrics["outcome"] != "incomplete" else None
    failures = check_expectations(metrics, expect)
    if not (job or {}).get("shared_checkpoint"):  # a trial that did not start from its own state
        failures += [shared_checkpoint_failure(finding) for finding in findings]
    return {"run": run.path.name, "scenario": run.info.scenario, "seed": run.info.seed,
            "trial": trial.name, **metrics,
            "expect": expectation_json(expect) if expect else "",
            # None (an empty CSV cell) when nothing was expected of this trial
            "expect_ok": (not failures) if expect or failures else None,
            "expect_failures": FAILURE_SEPARATOR.join(failures)}


def missing_trials(run: RunRecord) -> list[str]:
    """Trials run.json lists that have no folder: the run ended before they began."""
    stored = {trial.name for trial in run.trials}
    return [policy for policy in run.info.policies if policy not in stored]


def incomplete_text(run: RunRecord, frame: pd.DataFrame) -> str:
    """Where an incomplete run ended, before its table ("" for a complete run)."""
    lines = [f"INCOMPLETE: trial {row['trial']}: {row['outcome_reason']}"
             for _, row in frame.iterrows() if row["outcome"] == "incomplete"]
    missing = missing_trials(run)
    if missing:
        lines.append(f"INCOMPLETE: never began: {', '.join(missing)} (listed in run.json, no trial.json)")
    return "".join(f"{line}\n" for line in lines) + ("\n" if lines else "")


def run_frame(run: RunRecord) -> pd.DataFrame:
    frame = pd.DataFrame([trial_row(run, trial) for trial in run.trials])
    frame["expect_ok"] = frame["expect_ok"].astype("boolean")  # NA where nothing was expected
    return frame


def analyze_run(run_dir: Path) -> pd.DataFrame:
    """One row per trial of a stored run: every metric, the outcome and the expectation verdict."""
    return run_frame(load_run(Path(run_dir)))
