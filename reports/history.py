"""Loading stored runs through the run-folder contract (runfolder): a run folder's files ->
typed run and trial info, and each trial's events as a pandas DataFrame.

A folder the contract cannot read (not a run folder, no format_version, a newer format) is
refused with `RunFolderError`, one line naming the file, the problem and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from runfolder.events import COMMON_FIELDS, EVENTS_FILE, read_events as read_records
from runfolder.info import RunFolderError, RunInfo, TrialInfo, read_run_info, read_trial_info
from runfolder.layout import SCENARIO_FILE, TRIALS_DIR, trial_dirs

EVENT_COLUMNS = COMMON_FIELDS  # every events frame has them, even when the file is empty


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial: its info (trial.json, with its plan) and its events."""

    name: str
    path: Path
    info: TrialInfo
    events: pd.DataFrame


@dataclass(frozen=True)
class RunRecord:
    """One stored run: its info (run.json) and its trials in the order they ran."""

    path: Path
    info: RunInfo
    trials: tuple[TrialRecord, ...]
    scenario_text: str  # the copy of the scenario YAML ("" when the folder lacks it)


def events_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Events as a DataFrame sorted by time; `rank` is a nullable integer (None for the harness)."""
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    for column in EVENT_COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.Series(dtype="object")
    frame["t"] = pd.to_numeric(frame["t"], errors="coerce").astype(float)
    frame["rank"] = pd.to_numeric(frame["rank"], errors="coerce").astype("Int64")
    frame = frame.dropna(subset=["t"])
    return frame.sort_values("t", kind="stable").reset_index(drop=True)


def read_events(path: Path) -> pd.DataFrame:
    """The events of one file; a line torn by a SIGKILL mid-write is skipped."""
    return events_frame(read_records(path)[0])


def load_trial(path: Path) -> TrialRecord:
    """One trial folder: trial.json and events.jsonl."""
    return TrialRecord(name=path.name, path=path, info=read_trial_info(path),
                       events=read_events(path / EVENTS_FILE))


def load_run(run_dir: Path) -> RunRecord:
    """A run folder: run.json and every trials/<policy>/ folder (in run.json's policy order)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: no such run folder")
    info = read_run_info(run_dir)
    folders = trial_dirs(run_dir)
    if not folders:
        raise RunFolderError(f"{run_dir}: no trials ({TRIALS_DIR}/<policy>/ folders)")
    order = {policy: i for i, policy in enumerate(info.policies)}
    folders.sort(key=lambda p: (order.get(p.name, len(order)), p.name))
    scenario = run_dir / SCENARIO_FILE
    return RunRecord(path=run_dir, info=info, trials=tuple(load_trial(p) for p in folders),
                     scenario_text=scenario.read_text() if scenario.is_file() else "")
