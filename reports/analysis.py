"""A stored run -> one metrics row per trial, with its expectation verdicts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from reports.expect import FAILURE_SEPARATOR, check_expectations
from reports.history import RunRecord, TrialRecord, load_run
from reports.metrics import trial_metrics


def run_label(run: RunRecord) -> str:
    seed = run.info.get("seed")
    return f"{run.path.name} (seed {seed})" if seed is not None else run.path.name


def trial_row(run: RunRecord, trial: TrialRecord) -> dict[str, Any]:
    metrics = trial_metrics(trial.events, trial.info)
    expect = trial.info.get("expect") or None
    failures = check_expectations(metrics, expect)
    return {"run": run.path.name, "scenario": run.info.get("scenario", ""), "seed": run.info.get("seed"),
            "trial": trial.name, **metrics,
            "expect": json.dumps(expect, sort_keys=True) if expect else "",
            # None (an empty CSV cell) when the scenario set no expectation for this policy
            "expect_ok": (not failures) if expect else None,
            "expect_failures": FAILURE_SEPARATOR.join(failures)}


def run_frame(run: RunRecord) -> pd.DataFrame:
    frame = pd.DataFrame([trial_row(run, trial) for trial in run.trials])
    frame["expect_ok"] = frame["expect_ok"].astype("boolean")  # NA where nothing was expected
    return frame


def analyze_run(run_dir: Path) -> pd.DataFrame:
    """One row per trial of a stored run: every metric, the outcome and the expectation verdict."""
    return run_frame(load_run(Path(run_dir)))
