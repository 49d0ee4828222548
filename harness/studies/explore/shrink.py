"""Shrinking a failing schedule (`chaos explore`, docs/explore.md): smaller schedules tried
in turn, each run `repeats` times, and kept when it fails with the same signature in more
than half of its runs (a failure that reproduces, told from noise), until no smaller one does
or the time is up. Pure: what runs a candidate is passed in.

The candidates, simplest first, and the ones skipped unrun because nothing would cause their
faults are runfolder.shrinking's (`candidates`, `uncaused`), which the page (reports.explore)
also walks to replay shrinking from the folder's files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from runfolder.shrinking import Faults, candidates, uncaused


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
