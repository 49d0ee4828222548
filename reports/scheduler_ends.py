"""What a scheduler did to the whole job (the slurm backend): started it again after every
rank had ended (a requeue), or ended it for good (a preemption without requeue), and what a
resume finds: the newest checkpoint and the steps lost since it. The trial's facts
(reports.trial_facts) carry them; the outcome rules and the steps_lost column read them."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from reports.checkpoints import loaded_steps
from reports.trial_events import NAN, FaultWindow, end_reason, of_kind
from runfolder.events import CHECKPOINT, CHECKPOINT_SAVE, EXIT, FAULT_APPLIED, JOB_REQUEUED, RANK_EXITED, RESTORED, STEP


@dataclass(frozen=True)
class Requeue:
    """The scheduler started the job again after every rank had ended (a Slurm requeue)."""

    t: float
    restarts: int
    waited_s: float
    last_step: int | None      # the newest step any rank made before it
    restored: int | None       # the step every rank restored after it (None: not one step)

    @property
    def steps_lost(self) -> int | None:
        return None if self.last_step is None or self.restored is None else self.last_step - self.restored


@dataclass(frozen=True)
class Preempted:
    """The scheduler ended the job for good (a preemption, no requeue): what a resume finds."""

    t: float                  # the preemption's start
    last_step: int | None     # the newest step any rank made
    saved_step: int | None    # the newest checkpoint's step (None: nothing saved)
    saved_t: float = NAN      # when it was saved

    @property
    def on_signal(self) -> bool:
        return self.saved_t >= self.t

    @property
    def steps_lost(self) -> int | None:
        return None if self.last_step is None else self.last_step - (self.saved_step or 0)


def _newest_checkpoint(events: pd.DataFrame, before: float) -> tuple[int | None, float]:
    """The built-in runner's atomic checkpoints and a user's job's saves (the hook)."""
    saves = of_kind(events, CHECKPOINT, CHECKPOINT_SAVE)
    saves = saves[(saves["t"] <= before) & saves["step"].notna()] if len(saves) else saves
    if not len(saves):
        return None, NAN
    newest = saves.loc[saves["step"].astype(int).idxmax()]
    return int(newest["step"]), float(newest["t"])


def scheduler_preemption(events: pd.DataFrame, faults: tuple[FaultWindow, ...], end: float) -> Preempted | None:
    applied = of_kind(events, FAULT_APPLIED)
    ends = applied[applied["fault"].map(lambda f: isinstance(f, dict) and f.get("kind") == "preempt"
                                        and not f.get("requeue"))] if "fault" in applied else applied[:0]
    if not len(ends) or end_reason(events) != "all-exited":
        return None
    t = float(ends["t"].min())
    steps = of_kind(events, STEP)
    saved, saved_t = _newest_checkpoint(events, end)
    return Preempted(t=t, last_step=int(steps["step"].max()) if len(steps) else None, saved_step=saved,
                     saved_t=saved_t)


def scheduler_requeue(events: pd.DataFrame) -> Requeue | None:
    found = of_kind(events, JOB_REQUEUED)
    if not len(found):
        return None
    first = found.sort_values("t").iloc[0]
    t = float(first["t"])
    steps = of_kind(events, STEP)
    before = steps[steps["t"] < t]
    restores = of_kind(events, RESTORED)
    # the built-in runner says what it restored; a user's job, the file it loaded (the hook)
    after = set(restores[restores["t"] > t]["step"]) or loaded_steps(events, t)
    return Requeue(t=t, restarts=int(first["restarts"]), waited_s=float(first["waited_s"]),
                   last_step=int(before["step"].max()) if len(before) else None,
                   restored=int(after.pop()) if len(after) == 1 else None)


def requeue_detections(events: pd.DataFrame, fault: FaultWindow, requeue: Requeue) -> dict[int, float]:
    """Each rank's end between the fault and the requeue: the scheduler ending the job is
    what every rank knew of the fault."""
    ends = of_kind(events, EXIT, RANK_EXITED)
    ends = ends[(ends["t"] >= fault.start) & (ends["t"] < requeue.t) & ends["rank"].notna()]
    return {int(r): float(t) for r, t in ends.groupby("rank")["t"].min().items()}
