"""Faults anchored on events: which of a trial's events each anchor name means (the watch
that tells the orchestrator when an anchored fault's event came is harness.trial.anchor_watch).

    faults:
      - {kind: kill, target: {rank: 3}, start: {on: checkpoint_save, nth: 1, delay: 0.1s}}
      - {kind: link_down, target: {rank: 5}, start: {on: detect, rank: 0}, duration: 5s}

An anchor counts its events after warm-up, per process (a rank, or one of a user's job's
processes on a host): the fault is due `delay` after the first process to see its `nth`
(with `rank:`, that rank's `nth`). It waits at most `within` after warm-up (default: the
hang cap after the last fault at a time); an event that never came by then, or before the
trial ended, leaves the fault `not applied` (`fault_not_applied` with `waited_for`).

Where each anchor's events come from (docs/explore.md):

    anchor            the harness's runner            a user's job (the startup hook)
    step              step                            step (optimizer step, or chaos_hook.step())
    checkpoint_save   checkpoint_begin (rank 0)       checkpoint_begin (torch.save, dcp save)
    checkpoint_saved  checkpoint (rank 0)             checkpoint_save (torch.save, dcp save returned)
    restore           restored (after a failure)      checkpoint_load (torch.load, dcp load)
    detect            collective_error, suspect       job_output (an error line), suspect
    retry             retry                           none: torchrun restarts workers (rank_start)
    new_generation    group_ready (a re-formed group) group_init (init_process_group returned)
    rank_start        rank_start (a requeued job)     rank_start (a restarted worker)
    breaker           breaker_open                    none: a user's job has no breaker
"""
from __future__ import annotations

from dataclasses import dataclass

from runfolder import events as kinds


@dataclass(frozen=True)
class AnchorEvent:
    """One anchor name: the event kinds that mean it in the runner's and in a user's job's
    trial (none: that job never records it, and `missing` says what to anchor on instead)."""

    name: str
    runner: tuple[str, ...]
    job: tuple[str, ...]
    meaning: str
    missing: str = ""

    @property
    def after_failure(self) -> bool:
        """Only a failure brings it (after warm-up): a fault must cause it (the names are
        runfolder.events.AFTER_FAILURE_ANCHORS, which explore's shrinking reads too)."""
        return self.name in kinds.AFTER_FAILURE_ANCHORS


ANCHOR_EVENTS: dict[str, AnchorEvent] = {e.name: e for e in (
    AnchorEvent("step", (kinds.STEP,), (kinds.STEP,), "a training step completed"),
    AnchorEvent("checkpoint_save", (kinds.CHECKPOINT_BEGIN,), (kinds.CHECKPOINT_BEGIN,),
                "a checkpoint save began"),
    AnchorEvent("checkpoint_saved", (kinds.CHECKPOINT,), (kinds.CHECKPOINT_SAVE,),
                "a checkpoint save ended, written"),
    AnchorEvent("restore", (kinds.RESTORED,), (kinds.CHECKPOINT_LOAD,), "a rank loaded state to resume from"),
    AnchorEvent("detect", kinds.DETECTION_KINDS, kinds.DETECTION_KINDS, "a rank saw a fault"),
    AnchorEvent("retry", (kinds.RETRY,), (), "a rank re-joins after a failure",
                "a user's job records no retry (torchrun restarts its workers instead): anchor on rank_start"),
    AnchorEvent("new_generation", (kinds.GROUP_READY,), (kinds.GROUP_INIT,), "a process group formed again"),
    AnchorEvent("rank_start", (kinds.RANK_START,), (kinds.RANK_START,),
                "a rank's process started again (a restarted worker, a requeued job)"),
    AnchorEvent("breaker", (kinds.BREAKER_OPEN,), (), "a rank's circuit breaker opened",
                "a user's job has no circuit breaker: anchor on detect, or on rank_start for a restart"),
)}
ANCHOR_NAMES = tuple(ANCHOR_EVENTS)
CHECKPOINT_ANCHORS = ("checkpoint_save", "checkpoint_saved", "restore")
