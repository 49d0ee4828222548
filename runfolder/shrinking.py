"""The candidates of shrinking a failing schedule (`chaos explore`, docs/explore.md), in the
order shrinking tries them: one definition for the loop that runs them
(harness.studies.explore.shrink) and the page that replays that walk from tried.jsonl
(reports.explore). Pure: faults are the `faults:` entries of a scenario file, as dicts.

Smaller, simplest first (`candidates`): a fault left out; a two-rank target cut to one of
its ranks; a duration halved (not below `MIN_DURATION_S`); an anchor's nth brought to 1 and
its delay to 0; a start in seconds halved (to 0 below `MIN_DURATION_S`).

A candidate whose faults all wait for an event that only a failure brings (`detect`,
`restore`, `retry`, ...: runfolder.events.AFTER_FAILURE_ANCHORS), with no fault left at
seconds or on a step or save to cause one, is skipped without running: its faults would
never be applied (`uncaused`). Leaving out the one fault at seconds of a schedule makes such
candidates.

An explore schedule's times are written as the generator and `candidates` write them: a
number of seconds with the unit s (f"{seconds:g}s", "0.5s"), or a bare number; `seconds`
reads those, as chaos.units.parse_duration reads them.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterator

from runfolder.events import AFTER_FAILURE_ANCHORS

Faults = tuple[dict[str, Any], ...]
MIN_DURATION_S = 0.5
_SECONDS = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*s?\s*")


def seconds(value: str | float | int) -> float:
    """Seconds of an explore schedule's time: "1.5s", "0s", "1e+03s" or a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    if isinstance(value, str) and (match := _SECONDS.fullmatch(value)) and math.isfinite(float(match[1])):
        return float(match[1])
    raise ValueError(f"{value!r} is not a time as explore writes one (seconds, such as \"1.5s\")")


def _replaced(faults: Faults, index: int, **fields: Any) -> Faults:
    return faults[:index] + ({**faults[index], **fields},) + faults[index + 1:]


def candidates(faults: Faults) -> Iterator[Faults]:
    """Every schedule one step smaller than `faults`, simplest first."""
    if len(faults) > 1:
        for i in range(len(faults)):
            yield faults[:i] + faults[i + 1:]
    for i, fault in enumerate(faults):
        for rank in fault["target"].get("ranks", ()) if len(fault["target"].get("ranks", ())) > 1 else ():
            yield _replaced(faults, i, target={"rank": rank})
    for i, fault in enumerate(faults):
        if "duration" in fault and seconds(fault["duration"]) / 2 >= MIN_DURATION_S:
            yield _replaced(faults, i, duration=f"{seconds(fault['duration']) / 2:g}s")
    for i, fault in enumerate(faults):
        start = fault["start"]
        if isinstance(start, dict):
            nearer = {**start, "nth": 1, "delay": "0s"}
            if start.get("nth", 1) != 1 or seconds(start.get("delay", 0)) > 0:
                yield _replaced(faults, i, start=nearer)
        elif seconds(start) > 0:
            half = seconds(start) / 2
            yield _replaced(faults, i, start=f"{half if half >= MIN_DURATION_S else 0:g}s")


def uncaused(faults: Faults) -> str | None:
    """Why no fault of `faults` would ever be applied, or None: every one waits for an event
    that only a failure brings, and none is left to cause the first failure."""
    waiting = [f["start"]["on"] for f in faults
               if isinstance(f["start"], dict) and f["start"]["on"] in AFTER_FAILURE_ANCHORS]
    if len(waiting) < len(faults):
        return None
    return (f"its faults wait for {', '.join(dict.fromkeys(waiting))}, which only a failure brings, "
            f"and none is left at seconds or on a step or save to cause one")
