"""What a trial with a storage fault says of the job's checkpoint code: five named
invariants, each held, violated or not tested (nothing in the trial could break it), from
the state checker's violations (reports.state) and the recorded events.

    a finished save reloads        a save the job finished (the built-in runner's: written,
                                   fsynced and renamed) is what a later restore finds, not
                                   a torn file, after the storage lost what was not fsynced
    no torn save restored          no rank resumes from a save that failed or was torn, nor
                                   from weights no rank recorded at that step
    no silent restart from scratch once a checkpoint was written, no rank resumes from the
                                   initial state
    one restored step              the ranks of a generation resume at the same step
    a storage error hangs no rank  after a failed save or restore (ENOSPC, EIO, EROFS: its
                                   `checkpoint_failed`, `restore_failed`, or a restore that
                                   read past an unreadable file), every rank alive then
                                   records an event (a step, a detection, a retry, its exit)
                                   within 1.5 x the policy's timeout + 1 s (a user's job,
                                   or a policy that does not catch errors: the hang cap)

Tested: a restore or a load after a finished save (the first), after any save (the second),
after a checkpoint was written (the third); a generation two or more ranks resumed (the
fourth); a storage error (the fifth). The steps rolled back are the state checker's (the steps a
resume threw away, most on one rank).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from reports.state import FROM_SCRATCH, SAVE_LOST, STEPS_APART, TORN_RESTORED, StateVerdict
from runfolder.events import (CHECKPOINT, CHECKPOINT_FAILED, CHECKPOINT_LOAD, CHECKPOINT_SAVE, FAULT_APPLIED,
                              RESTORE_FAILED, RESTORED)
from runfolder.plan import TrialPlan

HELD, VIOLATED, NOT_TESTED = "held", "violated", "not tested"
SAVE_RELOADS, NO_TORN, NO_SCRATCH, ONE_STEP, NO_HANG = (
    "a finished save reloads", "no torn save restored", "no silent restart from scratch", "one restored step",
    "a storage error hangs no rank")
# the state checker's part in each of the first four
FROM_STATE = {SAVE_RELOADS: SAVE_LOST, NO_TORN: TORN_RESTORED, NO_SCRATCH: FROM_SCRATCH, ONE_STEP: STEPS_APART}
FINISHED_SAVES = (CHECKPOINT, CHECKPOINT_SAVE)
RESUMES = (RESTORED, RESTORE_FAILED, CHECKPOINT_LOAD)
HANG_FACTOR, HANG_SLACK_S = 1.5, 1.0


@dataclass(frozen=True)
class Finding:
    invariant: str
    result: str          # HELD | VIOLATED | NOT_TESTED
    detail: str = ""     # what it rests on, or the violation


def storage_faulted(events: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a storage fault was applied (its `fault_applied` names the folder it acts on)."""
    return any(e.get("kind") == FAULT_APPLIED and e.get("storage") for e in events)


def _t(event: Mapping[str, Any]) -> float:
    return float(event["t"])


def _rank(event: Mapping[str, Any]) -> int | None:
    value = event.get("rank")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def hang_window_s(plan: TrialPlan) -> float:
    """How long a rank may go without an event after a storage error before it is hung."""
    spec = plan.policy_spec
    if plan.job is not None or not spec.get("catch_errors", True):
        return plan.hang_cap
    return HANG_FACTOR * float(spec["timeout"]) + HANG_SLACK_S


def _storage_errors(events: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("kind") in (CHECKPOINT_FAILED, RESTORE_FAILED)
            or (e.get("kind") == RESTORED and e.get("unreadable"))]


def _error_text(event: Mapping[str, Any]) -> str:
    if event.get("kind") == CHECKPOINT_FAILED:
        return f"{event.get('errno') or 'an error'} on r{_rank(event)}'s save of step {int(event.get('step') or 0)}"
    if event.get("kind") == RESTORE_FAILED:
        return f"r{_rank(event)}'s restore found no readable checkpoint"
    return f"r{_rank(event)}'s restore read past an unreadable checkpoint"


def _no_hang(events: list[Mapping[str, Any]], plan: TrialPlan) -> Finding:
    errors = _storage_errors(events)
    if not errors:
        return Finding(NO_HANG, NOT_TESTED, "no save or restore failed")
    window = hang_window_s(plan)
    ranked = sorted((e for e in events if e.get("src") == "rank" and _rank(e) is not None), key=_t)
    end = max((_t(e) for e in events), default=0.0)
    gone = {}
    for e in events:
        if e.get("kind") in ("exit", "rank_exited") and (rank := _rank(e)) is not None:
            gone[rank] = min(gone.get(rank, math.inf), _t(e))
    first = min(errors, key=_t)
    t0 = _t(first)
    alive = [r for r in range(plan.ranks) if gone.get(r, math.inf) > t0]
    silent = [r for r in alive if not any(_rank(e) == r and t0 < _t(e) <= t0 + window for e in ranked)]
    names = ",".join(f"r{r}" for r in silent)
    if silent and t0 + window > end:
        return Finding(NO_HANG, NOT_TESTED, f"{_error_text(first)}; {names} recorded nothing in the "
                                            f"{end - t0:.2f} s the trial went on after it (under {window:g} s)")
    if silent:
        return Finding(NO_HANG, VIOLATED, f"{_error_text(first)}; then {names} recorded nothing for "
                                          f"{window:g} s: hung on it")
    return Finding(NO_HANG, HELD, f"{_error_text(first)}; every rank alive then ({len(alive)}) went on "
                                  f"within {window:g} s")


def _tested(invariant: str, events: list[Mapping[str, Any]], verdict: StateVerdict) -> str | None:
    """What a test of `invariant` rests on in this trial, or None where nothing tested it."""
    resumes = [_t(e) for e in events if e.get("kind") in RESUMES]
    if invariant == ONE_STEP:
        return "every generation's ranks resumed at one step" if verdict.restores_checked > 1 else None
    kinds = FINISHED_SAVES if invariant == SAVE_RELOADS else (*FINISHED_SAVES, CHECKPOINT_FAILED)
    saves = [_t(e) for e in events if e.get("kind") in kinds]
    after = [t for t in resumes if saves and t > min(saves)]
    if not after:
        return None
    return f"{len(after)} restores after {len([t for t in saves if t < max(after)])} saves"


def storage_findings(events: Iterable[Mapping[str, Any]], plan: TrialPlan, verdict: StateVerdict) -> list[Finding]:
    """The five invariants, in order, for a trial (its events, its plan, its state verdict)."""
    events = list(events)
    findings = []
    for invariant, part in FROM_STATE.items():
        broken = [v for v in verdict.violations if v.checkpoint == part]
        if broken:
            findings.append(Finding(invariant, VIOLATED, broken[0].detail))
        elif (tested := _tested(invariant, events, verdict)) is not None:
            findings.append(Finding(invariant, HELD, tested))
        else:
            findings.append(Finding(invariant, NOT_TESTED))
    findings.append(_no_hang(events, plan))
    return findings


def storage_text(events: Iterable[Mapping[str, Any]], plan: TrialPlan, verdict: StateVerdict) -> str:
    """One line for the report: each invariant's result ("" for a trial with no storage
    fault), then the steps a resume threw away."""
    events = list(events)
    if not storage_faulted(events):
        return ""
    parts = [f"{f.invariant}: {f.result}" + (f" ({f.detail})" if f.detail and f.result != NOT_TESTED else "")
             for f in storage_findings(events, plan, verdict)]
    lost = max(verdict.rolled_back.values(), default=0)
    return "; ".join(parts) + f"; steps rolled back: {lost}" + (" (most on one rank)" if lost else "")
