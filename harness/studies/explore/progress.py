"""`chaos explore`'s one progress line against its budget, the nightly's style: elapsed of
budget, schedules drawn, failure signatures found, ETA, and what the run under way is
(`doing_text`, from its schedule file's name: runfolder.explore). The clock is injected.
"""
from __future__ import annotations

import math
from typing import Callable

from harness.trial.progress import Progress, duration_text
from runfolder.explore import CANDIDATE, RERUN


class ExploreProgress:
    """Where explore stands against its budget: elapsed of budget, schedules drawn, failure
    signatures found, ETA and what it is doing. The ETA is the runs that still fit in the
    budget (explore starts a run only when this session's mean run fits) times that mean;
    unknown before the first run. `schedules` and `found` count earlier sessions' too."""

    def __init__(self, progress: Progress, budget_s: float, clock: Callable[[], float], first_run_s: float,
                 schedules: int = 0, found: int = 0) -> None:
        self.progress = progress
        self.budget_s = budget_s
        self.clock = clock
        self.start = clock()
        self.first_run_s = first_run_s    # the estimate before any run: one schedule's least time
        self.runs_s: list[float] = []      # this session's runs: drawn schedules, candidates, reruns
        self.schedules = schedules
        self.found = found

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def mean_run_s(self) -> float:
        return sum(self.runs_s) / len(self.runs_s) if self.runs_s else self.first_run_s

    def fits(self) -> bool:
        """Whether one more run (of the mean time so far) ends within the budget."""
        return self.elapsed_s() + self.mean_run_s() <= self.budget_s

    def eta_s(self) -> float | None:
        if not self.runs_s:
            return None
        mean = self.mean_run_s()
        return max(0, math.floor((self.budget_s - self.elapsed_s()) / mean)) * mean

    def line(self, doing: str) -> str:
        eta = self.eta_s()
        return (f"elapsed {duration_text(self.elapsed_s())} of {duration_text(self.budget_s)}  "
                f"{self.schedules} schedules  {self.found} found  ETA {'?' if eta is None else duration_text(eta)}  "
                f"{doing}")

    def show(self, doing: str) -> None:
        self.progress.phase("explore", self.line(doing))


def doing_text(stem: str, repeats: int) -> str:
    """What a run of the schedule file `stem` is, for the progress line."""
    if m := CANDIDATE.match(stem):
        return f"shrinking schedule {m[1]}: candidate s{m[2]}"
    if m := RERUN.match(stem):
        return f"rerunning found-{m[1]}.yaml (up to {repeats} runs)"
    return f"drawing: schedule {stem}"
