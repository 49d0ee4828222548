"""Loading stored runs: a run folder's files -> plain dicts and pandas DataFrames.

Nothing here imports the harness: the event format is read as the flat JSON lines it is
(see the package docstring), so any stored run can be re-analyzed without re-running it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

RUN_FILE = "run.json"
SCENARIO_FILE = "scenario.yaml"
TRIALS_DIR = "trials"
TRIAL_FILE = "trial.json"
EVENTS_FILE = "events.jsonl"
# Columns every events frame has, even when the file is empty or lacks a kind.
EVENT_COLUMNS = ("t", "src", "rank", "pid", "kind")


class RunFolderError(ValueError):
    """A folder that is not a readable run folder; the message is one line for the user."""


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial: its metadata (trial.json) and its events."""

    name: str
    path: Path
    info: dict[str, Any]
    events: pd.DataFrame


@dataclass(frozen=True)
class RunRecord:
    """One stored run: its metadata (run.json) and its trials in policy order."""

    path: Path
    info: dict[str, Any]
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
    records = []
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return events_frame(records)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object")
    return data


def load_trial(path: Path) -> TrialRecord:
    """One trial folder. Without trial.json the metadata comes from the trial_start event."""
    events = read_events(path / EVENTS_FILE)
    if (path / TRIAL_FILE).exists():
        info = _read_json(path / TRIAL_FILE)
    else:
        # An orchestrator that died mid-trial may leave only events: keep what they say.
        starts = events[events["kind"] == "trial_start"]
        info = {k: v for k, v in starts.iloc[0].items() if pd.notna(v)} if len(starts) else {}
    info.setdefault("policy", path.name)
    return TrialRecord(name=path.name, path=path, info=info, events=events)


def policy_name(entry: Any) -> str:
    """A run.json policies entry: a name, or a mapping with a name."""
    return str(entry.get("name")) if isinstance(entry, dict) else str(entry)


def load_run(run_dir: Path) -> RunRecord:
    """A run folder: run.json and every trials/<policy>/ folder (in run.json's policy order)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: no such run folder")
    info = _read_json(run_dir / RUN_FILE)
    trials_dir = run_dir / TRIALS_DIR
    folders = sorted(p for p in trials_dir.iterdir() if p.is_dir()) if trials_dir.is_dir() else []
    if not folders:
        raise RunFolderError(f"{run_dir}: no trials ({TRIALS_DIR}/<policy>/ folders)")
    order = {policy_name(entry): i for i, entry in enumerate(info.get("policies") or [])}
    folders.sort(key=lambda p: (order.get(p.name, len(order)), p.name))
    scenario = run_dir / SCENARIO_FILE
    return RunRecord(path=run_dir, info=info, trials=tuple(load_trial(p) for p in folders),
                     scenario_text=scenario.read_text() if scenario.is_file() else "")
