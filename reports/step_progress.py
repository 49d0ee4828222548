"""A trial's progress in steps: steps per second in a window, the normal interval between
steps, the gaps longer than a threshold (stalls) and the rank-seconds they waste. The
metrics row (reports.metrics) reads its steps/s, max stall and wasted rank-seconds here."""
from __future__ import annotations

import itertools
import math
import statistics

import pandas as pd

from reports.trial_events import NAN
from reports.trial_facts import TrialFacts

# Used only when no two steps were ever seen, so no interval can be measured.
FALLBACK_STEP_INTERVAL_S = 1.0


def step_rate(times: tuple[float, ...], lo: float, hi: float) -> float:
    """Steps completed per second in [lo, hi); NaN for an empty window. A stall counts as 0."""
    if not hi > lo:
        return NAN
    return sum(1 for t in times if lo <= t < hi) / (hi - lo)


def median_rate(rates: list[float]) -> float:
    rates = [r for r in rates if not math.isnan(r)]
    return statistics.median(rates) if rates else NAN


def normal_step_interval(step_times: dict[int, tuple[tuple[float, ...], ...]], before: float) -> float:
    """Median interval between a process's consecutive steps before `before` (pooled over
    every process of every rank)."""
    def intervals(limit: float) -> list[float]:
        out = []
        for times in itertools.chain.from_iterable(step_times.values()):
            kept = [t for t in times if t < limit]
            out += [b - a for a, b in itertools.pairwise(kept)]
        return out
    gaps = intervals(before) or intervals(math.inf)
    return statistics.median(gaps) if gaps else FALLBACK_STEP_INTERVAL_S


def progress_gaps(step_times: tuple[float, ...], lo: float, hi: float, threshold: float) -> list[float]:
    """Gaps longer than `threshold` between progress marks, clipped to [lo, hi].

    Marks: the last step at or before lo (lo itself if none), the steps inside, and hi."""
    if hi <= lo:
        return []
    before = [t for t in step_times if t <= lo]
    marks = [before[-1] if before else lo] + [t for t in step_times if lo < t < hi] + [hi]
    return [min(b, hi) - max(a, lo) for a, b in itertools.pairwise(marks) if b - a > threshold]


def _alive_window(events: pd.DataFrame, facts: TrialFacts, rank: int, start: float) -> tuple[float, float]:
    own = events[events["rank"] == rank]
    born = float(own["t"].min()) if len(own) else start
    gone = facts.departures[rank].t if rank in facts.departures else facts.observation_end
    return max(start, born), min(gone, facts.observation_end)


def waste(events: pd.DataFrame, facts: TrialFacts, threshold: float) -> tuple[float, float]:
    """(wasted rank-seconds, max stall) from fault start to the observation end."""
    start = facts.fault.start  # type: ignore[union-attr]
    total, longest = 0.0, 0.0
    for rank in facts.ranks:
        lo, hi = _alive_window(events, facts, rank, start)
        for times in facts.step_times.get(rank, ((),)):
            gaps = progress_gaps(times, lo, hi, threshold)
            total += sum(gaps)
            longest = max([longest, *gaps])
    return total, longest


def step_rates(events: pd.DataFrame, facts: TrialFacts, after_from: float) -> dict[str, float]:
    """Steps/s of a process (median over every process of every rank) before the fault,
    during it (while its rank lived) and after recovery."""
    fault = facts.fault
    assert fault is not None
    steps = facts.step_times
    during_to = facts.observation_end if math.isnan(fault.end) else fault.end
    during = []
    for rank in facts.ranks:
        lo, hi = _alive_window(events, facts, rank, fault.start)
        during += [step_rate(times, lo, min(hi, during_to)) for times in steps.get(rank, ((),))]
    return {
        # from each process's first step, which is not counted: it includes forming the group
        "steps_per_s_before": median_rate([step_rate(t[1:], t[0], fault.start)
                                           for t in itertools.chain.from_iterable(steps.values())]),
        "steps_per_s_during": median_rate(during),
        "steps_per_s_after": median_rate([step_rate(times, after_from, facts.observation_end)
                                          for r in facts.survivors for times in steps.get(r, ((),))]),
    }
