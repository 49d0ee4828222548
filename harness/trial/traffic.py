"""Proof that a fault reached the job's traffic: bytes through the faulted links.

For every fault on the network the trial samples every rank's link counter
(`Cluster.link_bytes`, the switch ports) and the steps each rank made: once a window before
the apply (as long as the fault stays on; shorter when warm-up ended sooner), just before
the apply (the window before ends), once the kernel acknowledged it (the window during
begins), and just before the revert (it ends). The differences go into the fault_applied / fault_reverted events
(runfolder.events TRAFFIC_BEFORE / TRAFFIC_DURING); the reports judge from them whether the
job's collectives crossed the faulted links (`bypassed`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from runfolder.plan import Action


@dataclass(frozen=True)
class Sample:
    t: float
    link_bytes: tuple[int, ...]  # per rank, since the link was made
    steps: tuple[int, ...]       # per rank, steps made since the trial began


def _between(first: Sample, last: Sample) -> tuple[list[int], list[int], float]:
    return ([b - a for a, b in zip(first.link_bytes, last.link_bytes, strict=True)],
            [b - a for a, b in zip(first.steps, last.steps, strict=True)], round(last.t - first.t, 6))


class TrafficWatch:
    """Samples the links around one trial's faults on the network; `take` reads them now.
    `starts`: for each apply of a fault on the network, when to take its before-sample, in
    seconds after warm-up."""

    def __init__(self, starts: dict[Action, float], gradient_bytes: int, take: Callable[[], Sample]) -> None:
        self._starts = starts
        self._gradient_bytes = gradient_bytes
        self._take = take
        self._before: dict[Action, Sample] = {}
        self._applied: dict[int, Sample] = {}  # by fault index, while it is on

    def due(self, since_warm: float) -> None:
        """Take the before-samples whose time has come."""
        for apply, start in self._starts.items():
            if apply not in self._before and start <= since_warm:
                self._before[apply] = self._take()

    def applying(self, apply: Action) -> dict[str, Any]:
        """Just before `apply`: fault_applied's traffic fields (none for a fault on a
        process)."""
        if apply not in self._starts:
            return {}
        now = self._take()
        first = self._before.get(apply, now)
        link_bytes, steps, secs = _between(first, now)
        return {"link_bytes_before": link_bytes, "steps_before": steps, "before_s": secs,
                "allreduce_bytes": self._gradient_bytes}

    def applied(self, apply: Action) -> None:
        """Once the kernel acknowledged `apply`: the during-window starts (what crossed while
        the apply was on its way is the window before's)."""
        if apply in self._starts:
            self._applied[apply.index] = self._take()

    def reverting(self, index: int) -> dict[str, Any]:
        """Just before fault `index` is reverted: fault_reverted's traffic fields."""
        applied = self._applied.pop(index, None)
        if applied is None:
            return {}
        link_bytes, steps, secs = _between(applied, self._take())
        return {"link_bytes_during": link_bytes, "steps_during": steps, "during_s": secs}
