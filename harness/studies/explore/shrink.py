"""Shrinking a failing schedule (`chaos explore`, docs/explore.md): smaller schedules tried
in turn, each run `repeats` times, and kept when it fails with the same signature in more
than half of its runs (a failure that reproduces, told from noise), until no smaller one does
or the time is up. Pure: what runs a candidate is passed in.

Smaller, simplest first (`candidates`): a fault left out; a two-rank target cut to one of
its ranks; a duration halved (not below `MIN_DURATION_S`); an anchor's nth brought to 1 and
its delay to 0; a start in seconds halved (to 0 below `MIN_DURATION_S`).

A candidate whose faults all wait for an event that only a failure brings (`detect`,
`restore`, `retry`, ...: AnchorEvent.after_failure), with no fault left at seconds or on a
step or save to cause one, is skipped without running: its faults would never be applied
(`uncaused`). Leaving out the one fault at seconds of a schedule makes such candidates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from chaos.units import parse_duration
from harness.scenario.anchors import ANCHOR_EVENTS

Faults = tuple[dict[str, Any], ...]
MIN_DURATION_S = 0.5


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
        if "duration" in fault and parse_duration(fault["duration"]) / 2 >= MIN_DURATION_S:
            yield _replaced(faults, i, duration=f"{parse_duration(fault['duration']) / 2:g}s")
    for i, fault in enumerate(faults):
        start = fault["start"]
        if isinstance(start, dict):
            nearer = {**start, "nth": 1, "delay": "0s"}
            if start.get("nth", 1) != 1 or parse_duration(start.get("delay", 0)) > 0:
                yield _replaced(faults, i, start=nearer)
        elif parse_duration(start) > 0:
            half = parse_duration(start) / 2
            yield _replaced(faults, i, start=f"{half if half >= MIN_DURATION_S else 0:g}s")


def uncaused(faults: Faults) -> str | None:
    """Why no fault of `faults` would ever be applied, or None: every one waits for an event
    that only a failure brings, and none is left to cause the first failure."""
    waiting = [f["start"]["on"] for f in faults
               if isinstance(f["start"], dict) and ANCHOR_EVENTS[f["start"]["on"]].after_failure]
    if len(waiting) < len(faults):
        return None
    return (f"its faults wait for {', '.join(dict.fromkeys(waiting))}, which only a failure brings, "
            f"and none is left at seconds or on a step or save to cause one")


@dataclass
class Shrunk:
    """Where shrinking ended: the smallest schedule that still failed, its reproduction
    rate, every candidate tried (faults, failed runs, runs), every one skipped without a
    run (faults, why: `uncaused`) and whether the time ran out."""

    faults: Faults
    reproduced: tuple[int, int]                  # (failed runs, runs) of `faults`
    tried: list[tuple[Faults, int, int]] = field(default_factory=list)
    skipped: list[tuple[Faults, str]] = field(default_factory=list)
    out_of_time: bool = False


def shrink(faults: Faults, reproduced: tuple[int, int], fails: Callable[[Faults], bool], repeats: int,
           time_left: Callable[[], bool]) -> Shrunk:
    """Greedy: take the first smaller candidate that fails in more than half of `repeats`
    runs (`fails(candidate)` runs it once), and start again from it. A candidate whose
    faults could never be applied (`uncaused`) is skipped, not run."""
    result = Shrunk(faults, reproduced)
    progress = True
    while progress:
        progress = False
        for candidate in candidates(result.faults):
            if (why := uncaused(candidate)) is not None:
                if (candidate, why) not in result.skipped:
                    result.skipped.append((candidate, why))
                continue
            failed = 0
            for run in range(repeats):
                if not time_left():
                    result.out_of_time = True
                    return result
                failed += fails(candidate)
                if failed * 2 > repeats or (failed + repeats - run - 1) * 2 <= repeats:
                    break  # decided either way: the rest of the runs cannot change it
            runs = run + 1
            result.tried.append((candidate, failed, runs))
            if failed * 2 > repeats:
                result.faults, result.reproduced, progress = candidate, (failed, runs), True
                break
    return result
