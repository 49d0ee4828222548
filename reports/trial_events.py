"""A trial's events table read the one way every judge of it reads it: the rows of some
kinds, an optional field of a row, the harness's end reason, and the fault windows (each
applied fault with when it was reverted). The bottom of the metrics modules
(reports.trial_facts, reports.scheduler_ends, reports.metrics), so each reads events alike."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from runfolder.events import FAULT_APPLIED, FAULT_REVERTED, TRIAL_END

NAN = float("nan")


@dataclass(frozen=True)
class FaultWindow:
    index: int
    kind: str
    targets: tuple[int, ...]
    start: float
    end: float  # NaN when the fault was never reverted
    requested: float = NAN  # just before the harness acted; a signal can act before `start`
    reaches: tuple[int, ...] = ()  # the other ranks it reached (a Slurm node's link: every rank there)
    processes: str = "host"  # a process fault's: the host whole, or its agent's "workers" (chaos.faults)

    @property
    def label(self) -> str:
        """The fault in a report's words: its kind, and whose processes where not the host's."""
        return self.kind if self.processes == "host" else f"{self.kind} ({self.processes})"


def of_kind(events: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    return events[events["kind"].isin(kinds)]


def event_field(row: pd.Series, name: str, default: Any = None) -> Any:
    value = row.get(name, default)
    if isinstance(value, float) and math.isnan(value):
        return default
    return default if value is None or value is pd.NA else value


def fault_windows(events: pd.DataFrame) -> tuple[FaultWindow, ...]:
    """Applied faults in the order they were applied (a fault anchored on an event may come
    after one listed below it: the first applied is the trial's fault, whose detection and
    recovery the report measures), each with the time it was reverted (NaN if never)."""
    # A revert at teardown ends the harness's cleanup, not the fault: it never healed in view.
    healed = of_kind(events, FAULT_REVERTED)
    healed = healed[~flagged(healed, "teardown")]
    reverted = {int(r["index"]): r["t"] for _, r in healed.iterrows()}
    windows = []
    for _, row in of_kind(events, FAULT_APPLIED).iterrows():
        # the event's `kind` is the event kind: the fault's kind is `fault_kind`
        windows.append(FaultWindow(index=int(row["index"]), kind=str(row["fault_kind"]),
                                   targets=tuple(int(r) for r in row["targets"]), start=float(row["t"]),
                                   end=float(reverted.get(int(row["index"]), NAN)),
                                   requested=float(row["t_requested"]),
                                   reaches=tuple(int(r) for r in event_field(row, "reaches", None) or ()),
                                   processes=_processes(event_field(row, "fault", None))))
    return tuple(sorted(windows, key=lambda w: (w.start, w.index)))


def _processes(fault: Any) -> str:
    return str(fault.get("processes", "host")) if isinstance(fault, dict) else "host"


def flagged(events: pd.DataFrame, column: str) -> pd.Series:
    """Rows whose optional boolean field `column` is true."""
    if column not in events:
        return pd.Series(False, index=events.index)
    return events[column].map(lambda v: v is True)


def end_reason(events: pd.DataFrame) -> str:
    ends = of_kind(events, TRIAL_END)
    return str(event_field(ends.iloc[0], "reason", "")) if len(ends) else ""
