"""Defects planted on purpose, to prove that `chaos explore` finds what matters
(docs/explore.md, "Planted defects"). A policy opts in with `planted_defect: NAME`; no
shipped scenario does, and without it the rank runs the runner and checkpoints unchanged.
Never use one to test a real job: each is a bug.

    restore_while_saving  group rank 0 writes each checkpoint straight to its final name, in
                          `SAVE_CHUNKS` chunks over `SAVE_S` (a large model's save, long
                          enough for a kill to land inside it), and the restore takes the
                          newest file by name as always: after a kill during a save, that is
                          the half-written one. Only a kill of the saver during a save shows
                          it (a policy that goes on without the killed rank: elastic)
    retries_never_reset   the runner counts tries since the trial began, not since the last
                          working group: the first fault recovers, and a second one, long
                          after, finds the tries already spent (with max_retries 1, it gives up)
"""
from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any, Callable

import torch

from harness.job.checkpoint import Checkpointer
from harness.job.outcome import Failure
from harness.job.policies import PlantedDefect
from harness.job.runner import FaultTolerantRunner, State

SAVE_S = 1.2       # how long restore_while_saving's save takes (the shipped one: 3-5 ms)
SAVE_CHUNKS = 12


class SavesInPlace(Checkpointer):
    """restore_while_saving: no temp file, no rename; the final name holds a partial file
    while the save is under way (and for good once its writer is killed), and the restore
    loads the newest file as it is, torn or not."""

    skips_torn = False

    def __init__(self, directory: Path | str, keep: int = 3, sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(directory, keep)
        self.sleep = sleep

    def save(self, step: int, state: dict[str, Any]) -> Path:
        final = self.path(step)
        # the final name is truncated first, as a writer in place does: serialising first
        # left a few ms after `checkpoint_begin` in which a kill found no partial file (the
        # first save's: no file at all), and 1 in 10 reruns under load missed the defect
        with open(final, "wb") as f:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            data = buffer.getvalue()
            chunk = -(-len(data) // SAVE_CHUNKS)
            for start in range(0, len(data), chunk):
                f.write(data[start:start + chunk])
                f.flush()  # what is written so far is what a reader of the file gets
                self.sleep(SAVE_S / SAVE_CHUNKS)
        for old in self.steps()[:-self.keep]:
            self.path(old).unlink(missing_ok=True)
        return final


class RetriesNeverReset(FaultTolerantRunner):
    """retries_never_reset: a step or a join that works leaves the count of tries as it was."""

    def _after(self, failure: Failure | None) -> State:
        tries = self._tries
        state = super()._after(failure)
        self._tries = tries
        return state


def planted(defect: PlantedDefect | None) -> tuple[type[FaultTolerantRunner], type[Checkpointer]]:
    """The runner and checkpointer classes a rank uses: the shipped ones unless a defect is planted."""
    if defect == "restore_while_saving":
        return FaultTolerantRunner, SavesInPlace
    if defect == "retries_never_reset":
        return RetriesNeverReset, Checkpointer
    return FaultTolerantRunner, Checkpointer
