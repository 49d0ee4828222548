"""What this rank's failure detector said, written once and remembered with its time.

    watch       asked while a collective, a rendezvous or the pacing sleep waits: a reason
                to stop waiting when a member is suspect (a `suspect` event once per
                (generation, peer, via)); a wait of `straggler_after` with every member
                alive reports the degraded ones (`straggler`, once per (generation, step))
    exclusion   who to leave out of the next proposal: a rank whose process is gone at
                once, a silent one once it has been suspect for `exclude_after` (it may
                speak again; a member no longer suspect is forgotten, so a later silence
                starts a new grace, as it does once a generation forms)
    cut_off     this rank hears no digest, and its group no longer steps: the health check
                of a policy with a detector (`stepped` tells the detector of each step)
    rejoin_asked  a rank asked to rejoin since this rank last looked (or its generation
                formed): the pacing sleep ends, so the step that admits it starts now

Pure given the detector's verdicts and the clock: unit-tested with a scripted detector.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from harness.job.detector import FailureDetector, Suspicion
from runfolder import events as kinds
from runfolder.events import EventRecorder


@dataclass(frozen=True)
class Exclusion:
    """Who is gone from the members now, and whether to propose without them yet."""

    gone: tuple[Suspicion, ...]  # connection or heartbeat suspicions, in the detector's order
    settled: bool                # no silent member is still within its grace

    @property
    def peers(self) -> list[int]:
        return sorted({s.peer for s in self.gone})


class Suspicions:
    def __init__(self, detector: FailureDetector, recorder: EventRecorder,
                 clock: Callable[[], float], straggler_after: float, exclude_after: float) -> None:
        self.detector = detector
        self.recorder = recorder
        self.clock = clock
        self.straggler_after = straggler_after
        self.exclude_after = exclude_after
        self._reported: set[tuple[int, int, str]] = set()  # (generation, peer, via) written
        self._slow_waits: set[tuple[int, int]] = set()      # (generation, step) with stragglers written
        self._suspected_at: dict[int, float] = {}           # member -> when first suspected
        self._asks_seen = 0                                 # rejoin requests already acted on

    def stepped(self) -> None:
        """This rank finished a step with its group (the detector's cut-off rule asks)."""
        self.detector.stepped()

    def watch(self, generation: int, members: tuple[int, ...], step: int,
              waited_s: float) -> str | None:
        """A reason to stop waiting if a member is suspect; reports stragglers."""
        suspicions = self.detector.judge(members, generation)
        self._note(suspicions)
        for s in suspicions:
            if (generation, s.peer, s.via) not in self._reported:
                self._reported.add((generation, s.peer, s.via))
                self.recorder.emit(kinds.SUSPECT, peer=s.peer, via=s.via, cause=s.via,
                                   silent_s=s.silent_s, gen=generation, waited_s=round(waited_s, 3))
        if suspicions:
            return suspicions[0].describe()
        if waited_s >= self.straggler_after and (generation, step) not in self._slow_waits:
            self._slow_waits.add((generation, step))
            for slow in self.detector.stragglers(members) or [None]:
                self.recorder.emit(kinds.STRAGGLER, peer=getattr(slow, "peer", None),
                                   loss=getattr(slow, "loss", None),
                                   silent_s=getattr(slow, "silent_s", None),
                                   waited_s=round(waited_s, 3), gen=generation, step=step)
        return None

    def exclusion(self, members: tuple[int, ...]) -> Exclusion:
        gone = tuple(s for s in self.detector.judge(members, -1)
                     if s.via in ("connection", "heartbeat"))
        now = self._note(gone)
        silent_since = [self._suspected_at[s.peer] for s in gone if s.via == "heartbeat"]
        return Exclusion(gone, not silent_since or now >= min(silent_since) + self.exclude_after)

    def cut_off(self, me: int) -> Suspicion | None:
        """This rank's own suspicion of itself, if it hears nothing from the control plane."""
        return next((s for s in self.detector.judge((me,), -1) if s.via == "cut-off"), None)

    def rejoin_asked(self) -> bool:
        """True once for each new request to rejoin in the digests."""
        asks = self.detector.rejoin_asks()
        if asks <= self._asks_seen:
            return False
        self._asks_seen = asks
        return True

    def generation_formed(self) -> None:
        """A member silent from now on starts a new grace; requests to rejoin so far were
        for this generation to answer."""
        self._suspected_at.clear()
        self._asks_seen = self.detector.rejoin_asks()

    def _note(self, suspicions: Iterable[Suspicion]) -> float:
        now = self.clock()
        suspected = {s.peer for s in suspicions}
        for peer in set(self._suspected_at) - suspected:
            del self._suspected_at[peer]  # it spoke again
        for peer in suspected:
            self._suspected_at.setdefault(peer, now)
        return now
