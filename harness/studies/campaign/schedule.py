"""A campaign's fault schedule: a Poisson process drawn from a mix with the seed, once, the
same for every policy (compare like with like).

Faults arrive with exponential gaps of mean `mtbf`, from `lead_in` (the job has trained a
while) to `duration`; each takes a category by its share, its duration drawn from the
category's range, and a target rank drawn among those it can hit: not one a kill took
earlier in the schedule, not one the same kind still holds. The draws do not depend on the
backend: a category the backend cannot inject is drawn all the same (the same seed gives the
same times everywhere) and listed as left out."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from chaos import units
from harness.studies.campaign.mix import Mapped

IRREVERSIBLE = ("kill", "preempt")  # the rank does not come back within the job


@dataclass(frozen=True)
class ScheduledFault:
    at: float                      # seconds after the campaign's window starts
    category: str
    fault: dict[str, Any] | None   # kind and parameters; None: left out
    duration: float | None         # None: no end (a kill)
    target: int | None
    left_out: str | None = None    # why it is not injected

    @property
    def kind(self) -> str | None:
        return None if self.fault is None else str(self.fault["kind"])

    def text(self) -> str:
        what = (f"{self.kind} on r{self.target}" + (f" for {units.format_duration(self.duration)}"
                                                     if self.duration else "")) if self.fault else \
            f"not injected ({self.left_out})"
        return f"+{self.at:7.1f} s  {self.category:24} {what}"


def draw_schedule(mapping: tuple[Mapped, ...], mtbf: float, duration: float, lead_in: float,
                  ranks: int, seed: int) -> tuple[ScheduledFault, ...]:
    """The faults of one campaign window, in time order (a pure function of its arguments)."""
    rng = random.Random(f"campaign/{seed}")
    names = [m.category.name for m in mapping]
    shares = [m.category.share for m in mapping]
    gone: set[int] = set()                          # ranks a kill took
    busy: dict[tuple[int, str], float] = {}         # (rank, kind) -> when it heals
    faults = []
    t = lead_in
    while True:
        t += rng.expovariate(1.0 / mtbf)
        if t >= duration:
            break
        mapped = mapping[names.index(rng.choices(names, weights=shares)[0])]
        pick = rng.random()       # drawn for every fault, so every backend draws alike
        stretch = rng.random()
        if mapped.injection is None:
            faults.append(ScheduledFault(round(t, 3), mapped.category.name, None, None, None, mapped.left_out))
            continue
        injection = mapped.injection
        span = None if injection.duration is None else round(min(
            injection.duration.low + stretch * (injection.duration.high - injection.duration.low), duration - t), 3)
        free = [r for r in range(ranks) if r not in gone and busy.get((r, injection.kind), 0.0) <= t]
        # the job keeps two ranks no kill takes: a world of one trains nothing collective
        if injection.kind in IRREVERSIBLE and len([r for r in range(ranks) if r not in gone]) <= 2:
            free = []
        if not free:
            faults.append(ScheduledFault(round(t, 3), mapped.category.name, None, None, None,
                                         f"no rank left for a {injection.kind} (kills took {len(gone)} of {ranks})"))
            continue
        target = free[min(int(pick * len(free)), len(free) - 1)]
        if injection.kind in IRREVERSIBLE:
            gone.add(target)
        elif span is not None:
            busy[(target, injection.kind)] = t + span
        faults.append(ScheduledFault(round(t, 3), mapped.category.name, dict(injection.fault), span, target))
    return tuple(faults)


def expected_faults(mtbf: float, duration: float, lead_in: float) -> float:
    return max(0.0, duration - lead_in) / mtbf
