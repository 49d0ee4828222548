"""The watch that tells the orchestrator when an anchored fault's event came: what each
anchor name means is harness.scenario.anchors (ANCHOR_EVENTS)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.scenario.anchors import ANCHOR_EVENTS
from runfolder import events as kinds
from runfolder.plan import PlannedFault


@dataclass(frozen=True)
class Fired:
    """Anchored fault `index`'s event came: at `t` (monotonic), on `rank`."""

    index: int
    t: float
    rank: int


@dataclass
class AnchorWatch:
    """The anchored faults of one trial still waiting for their event. `see` every rank
    event read after warm-up (`t_warm`), then `take` those whose event came."""

    faults: tuple[PlannedFault, ...]
    job: bool                        # a user's job's trial (its events differ: ANCHOR_EVENTS)
    t_warm: float
    waiting: dict[int, Any] = field(default_factory=dict)   # index -> runfolder.plan.Anchor
    _counts: dict[int, dict[tuple[int, int], int]] = field(default_factory=dict)
    _fired: list[Fired] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.waiting = {f.index: f.anchor for f in self.faults if f.anchor is not None}
        self._counts = {index: {} for index in self.waiting}

    def kinds_of(self, index: int) -> tuple[str, ...]:
        meaning = ANCHOR_EVENTS[self.waiting[index].on]
        return meaning.job if self.job else meaning.runner

    def see(self, event: dict[str, Any]) -> None:
        if event.get("src") != kinds.RANK or event["t"] < self.t_warm:
            return
        for index, anchor in list(self.waiting.items()):
            if event["kind"] not in self.kinds_of(index) or (anchor.rank is not None and event["rank"] != anchor.rank):
                continue
            process = (event["rank"], event.get("local_rank") or 0)
            counts = self._counts[index]
            counts[process] = counts.get(process, 0) + 1
            if counts[process] == anchor.nth:
                del self.waiting[index]
                self._fired.append(Fired(index, float(event["t"]), int(event["rank"])))

    def take(self) -> list[Fired]:
        """The anchored faults whose event came since the last call, in the order they came."""
        fired, self._fired = self._fired, []
        return fired

    def expired(self, now: float) -> list[int]:
        """The anchored faults whose wait ended by `now` (monotonic) without their event;
        they wait no more."""
        gone = [index for index, anchor in self.waiting.items() if now >= self.t_warm + anchor.until]
        for index in gone:
            del self.waiting[index]
        return gone

    def give_up(self) -> list[int]:
        """Every anchored fault still waiting (the trial ends): none waits any more."""
        gone, self.waiting = list(self.waiting), {}
        return gone
