"""What ends a try and what ends a rank: a `Failure` to recover from, an `ExitReason` to leave with.

Standard library only: harness.job.rank names its exit reasons and codes before it imports
torch.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.job.group import CollectiveError


@dataclass(frozen=True)
class Failure:
    """One failed try: the runner recovers from it under its policy. A failure of a
    collective or a rendezvous is the `collective_error` event's fields."""

    step: int         # the step this rank was on (the next one to run)
    generation: int   # the generation that failed: recovery moves past it
    phase: str        # step | join | rejoin (of a CollectiveError) | pace (the detector ended
                      # the wait between two steps)
    cause: str        # timeout | closed | reset | rendezvous | suspect | other (of a
                      # CollectiveError) | left-out (a generation went on without this rank)
    error: str

    @classmethod
    def of(cls, exc: CollectiveError, step: int, generation: int) -> Failure:
        return cls(step, generation, exc.phase, exc.cause, str(exc))


class ExitReason(enum.Enum):
    """Why a rank's process ended: the `exit` event's reason (reports read these values)."""

    STOPPED = "stopped"                       # reached max_steps
    FAILED_FAST = "failed-fast"               # gave up at the first failure (timeout policy)
    RETRIES_EXHAUSTED = "retries-exhausted"   # retry policy ran out of tries
    ISOLATED = "isolated"                     # the breaker opened
    TERMINATED = "terminated"                 # SIGTERM: the harness stopped it
    CRASHED = "crashed"                       # an uncaught error


EXIT_CODES = {ExitReason.STOPPED: 0, ExitReason.FAILED_FAST: 3, ExitReason.RETRIES_EXHAUSTED: 4,
              ExitReason.ISOLATED: 5, ExitReason.TERMINATED: 0, ExitReason.CRASHED: 70}
