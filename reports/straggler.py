"""Straggler detectors scored against the ground truth only a harness has: which rank a
`slow` or `step_delay` fault slowed, and from when to when.

A synchronous all-reduce equalises every rank's step time, so a step's duration cannot say
which rank is slow. Three detectors are scored, each per window of WINDOW steps (flagged at
the window's last step):

    compute score    the way NVIDIA's straggler module scores ranks (nvidia-resiliency-ext,
                     `straggler`, its relative score): each rank's median compute time (the
                     `step` events' `compute`: the built-in runner's wall time of the local
                     part before the all-reduce; a user's job's step less its wait from its
                     last gradient to its optimizer step); the fastest rank's median over its own,
                     under THRESHOLD (0.7, that module's default) flags it
    wait score       who the others wait for: each rank's median wait in the all-reduce
                     (the step's `dur` less its `compute`) over the median of every rank's;
                     under WAIT_THRESHOLD (0.5) flags it, where the ranks' median wait is
                     WAIT_FLOOR_S or more (a job that waits for nobody flags nobody). A rank
                     stalled in bursts (a GC pause, a scheduling delay) may compute as fast
                     as ever between them, so only its peers' waits show it
    heartbeats       the built-in failure detector's `straggler` events (a collective
                     pending with every member alive; the peer whose heartbeats arrive
                     degraded): the peer it names is flagged then

Scored per trial with a slow fault: a flag of a slowed rank while its fault is on (until
one window after its end: a window straddles it) is a true one; any other flag is false.
Precision is the true flags' share of the ranks flagged, recall the slowed ranks flagged,
and the time to flag the first true flag after its fault began. "not observed" where the
trial recorded no compute times (a run folder before format 19; a user's job before format
20, or one whose parameters take no gradient hook), or where no failure detector ran (the
heartbeats).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from runfolder.events import FAULT_APPLIED, FAULT_REVERTED, STEP, STRAGGLER

WINDOW, THRESHOLD = 8, 0.7
SLOWING = ("slow", "step_delay")  # the fault kinds that make a rank a straggler
WAIT_THRESHOLD, WAIT_FLOOR_S = 0.5, 0.02


@dataclass(frozen=True)
class Slowed:
    """Ground truth: ranks slowed from `start` to `end` (inf: never healed)."""

    ranks: frozenset[int]
    start: float
    end: float


@dataclass(frozen=True)
class Score:
    detector: str
    observed: bool
    flagged: frozenset[int] = frozenset()        # every rank flagged at any time
    true: frozenset[int] = frozenset()           # slowed ranks flagged while slowed
    first_true_s: float | None = None            # after its fault began

    def precision(self) -> float:
        return len(self.true) / len(self.flagged) if self.flagged else math.nan

    def recall(self, truth: frozenset[int]) -> float:
        return len(self.true) / len(truth) if truth else math.nan

    def text(self, truth: frozenset[int]) -> str:
        if not self.observed:
            return f"{self.detector}: not observed"
        if not self.flagged:
            return f"{self.detector}: flagged none (recall 0 of {len(truth)})"
        names = ",".join(f"r{r}" for r in sorted(self.flagged))
        when = f" in {self.first_true_s:.2f} s" if self.first_true_s is not None else ""
        return (f"{self.detector}: flagged {names}{when} (precision {self.precision():.2f}, "
                f"recall {len(self.true)} of {len(truth)})")


def slowed(events: Iterable[Mapping[str, Any]]) -> list[Slowed]:
    """Each slowing fault's ranks and window, from the harness's own records."""
    applied: dict[int, tuple[frozenset[int], float]] = {}
    windows = []
    for e in sorted(events, key=lambda e: float(e["t"])):
        if e.get("fault_kind") not in SLOWING:
            continue
        if e.get("kind") == FAULT_APPLIED:
            applied[int(e["index"])] = (frozenset(int(r) for r in e.get("targets") or ()), float(e["t"]))
        elif e.get("kind") == FAULT_REVERTED and int(e["index"]) in applied:
            ranks, start = applied.pop(int(e["index"]))
            windows.append(Slowed(ranks, start, float(e["t"])))
    windows += [Slowed(ranks, start, math.inf) for ranks, start in applied.values()]
    return windows


Windows = list[dict[int, list[tuple[float, float, float]]]]  # per window: rank -> (t, compute, wait)


def _windows(events: Iterable[Mapping[str, Any]]) -> Windows | None:
    """The steps that carry compute, by (generation, window) and rank; None: none does."""
    by_window: dict[tuple[int, int], dict[int, list[tuple[float, float, float]]]] = {}
    for e in events:
        if e.get("kind") != STEP or e.get("compute") is None or _nan(e.get("compute")):
            continue
        key = (int(e.get("gen") or 0), int(e["step"]) // WINDOW)
        compute = float(e["compute"])
        by_window.setdefault(key, {}).setdefault(int(e["rank"]), []).append(
            (float(e["t"]), compute, max(0.0, float(e["dur"]) - compute)))
    return list(by_window.values()) or None


def _flags(windows: Windows | None, flagged: Callable[[dict[int, float]], list[int]], field: int) -> list[tuple[float, int]] | None:
    """(time, rank) of every flag: per whole window, the ranks `flagged` picks from each
    rank's median of `field` (1: compute, 2: wait)."""
    if windows is None:
        return None
    flags = []
    for ranks in windows:
        medians = {r: statistics.median(x[field] for x in got) for r, got in ranks.items() if len(got) == WINDOW}
        if len(medians) >= 2:
            flags += [(max(x[0] for x in ranks[r]), r) for r in flagged(medians)]
    return sorted(flags)


def _slow_compute(medians: dict[int, float]) -> list[int]:
    fastest = min(medians.values())
    return [r for r, m in medians.items() if m > 0 and fastest / m < THRESHOLD]


def _waited_for(medians: dict[int, float]) -> list[int]:
    typical = statistics.median(medians.values())
    return [r for r, m in medians.items() if typical >= WAIT_FLOOR_S and m / typical < WAIT_THRESHOLD]


def compute_flags(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, int]] | None:
    """(time, rank) of every flag of the compute score; None where no step carried compute."""
    return _flags(_windows(events), _slow_compute, 1)


def wait_flags(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, int]] | None:
    """(time, rank) of every flag of the wait score; None where no step carried compute."""
    return _flags(_windows(events), _waited_for, 2)


def heartbeat_flags(events: Iterable[Mapping[str, Any]], detector: bool) -> list[tuple[float, int]] | None:
    """(time, peer) of every peer the failure detector named a straggler; None without one."""
    if not detector:
        return None
    return sorted((float(e["t"]), int(e["peer"])) for e in events
                  if e.get("kind") == STRAGGLER and e.get("peer") is not None and not _nan(e.get("peer")))


def _median_step(events: list[Mapping[str, Any]]) -> float:
    """The steps' median duration: the pace of a job that sets its own (a user's job)."""
    durations = [float(e["dur"]) for e in events if e.get("kind") == STEP and e.get("dur") is not None
                 and not _nan(e.get("dur"))]
    return statistics.median(durations) if durations else 0.0


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def score(name: str, flags: list[tuple[float, int]] | None, truth: list[Slowed], slack_s: float) -> Score:
    """`flags` against the slow faults' windows (each held `slack_s` past its end)."""
    if flags is None:
        return Score(name, False)
    true = [(t, r) for t, r in flags for w in truth if r in w.ranks and w.start <= t <= w.end + slack_s]
    first = min((t - w.start for t, r in true for w in truth if r in w.ranks and w.start <= t), default=None)
    return Score(name, True, frozenset(r for _, r in flags), frozenset(r for _, r in true), first)


def straggler_text(events: Iterable[Mapping[str, Any]], step_period: float, detector: bool) -> str:
    """The report's line for a trial with a slow fault ("" without one): each detector's
    flags, precision, recall and time to flag against the slowed ranks. `step_period`: the
    workload's pace (0: the job's own, its median step)."""
    events = list(events)
    truth = slowed(events)
    if not truth:
        return ""
    ranks = frozenset().union(*(w.ranks for w in truth))
    slack = WINDOW * (step_period or _median_step(events))
    scores = [score("compute score", compute_flags(events), truth, slack),
              score("wait score", wait_flags(events), truth, slack),
              score("heartbeats", heartbeat_flags(events, detector), truth, slack)]
    slowed_names = ",".join(f"r{r}" for r in sorted(ranks))
    return f"slowed {slowed_names}; " + "; ".join(s.text(ranks) for s in scores)
