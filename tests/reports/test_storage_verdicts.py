"""The storage invariants (reports.storage) on scripted histories: which of them the job's
checkpoint code kept under a storage fault. Real runs judge them in scenarios/
disk_full_mid_save.yaml, io_error_restore.yaml and lose_unsynced*.yaml (the nights)."""
from __future__ import annotations

import dataclasses

from reports.state import check_state
from reports.storage import (HELD, NO_HANG, NO_SCRATCH, NO_TORN, NOT_TESTED, ONE_STEP, SAVE_RELOADS, VIOLATED,
                             storage_findings, storage_text)
from runfolder.plan import TrialPlan
from tests.reports.test_state import (History, job_with_restore, saved_job, user_job, with_checkpoint_files,
                                     with_saves)

PLAN = TrialPlan(policy="retry", policy_spec={"name": "retry", "base": "retry", "timeout": 1.0, "catch_errors": True},
                 workload={"step_period": 0.1}, ranks=4, seed=1, warmup_steps=4, settle_steps=4, hang_cap=15.0,
                 faults=(), actions=(), expect=None)
DISK_FULL = {"kind": "fault_applied", "src": "harness", "rank": None, "index": 0, "fault_kind": "disk_full",
             "targets": [0], "storage": "/trial/ckpt"}


def faulted(h: History) -> list[dict]:
    return [{**DISK_FULL, "t": h.events[0]["t"] - 0.001}, *h.events]


def results(events: list[dict]) -> dict[str, tuple[str, str]]:
    return {f.invariant: (f.result, f.detail) for f in storage_findings(events, PLAN, check_state(events))}


def test_a_clean_restore_after_a_durable_save_keeps_every_invariant_it_tests():
    found = results(faulted(saved_job()))
    assert {k: r for k, (r, _) in found.items()} == {
        SAVE_RELOADS: HELD, NO_TORN: HELD, NO_SCRATCH: HELD, ONE_STEP: HELD, NO_HANG: NOT_TESTED}
    assert found[SAVE_RELOADS][1] == "4 restores after 3 saves"


def test_a_durable_save_found_torn_breaks_a_finished_save_reloads_only():
    h = saved_job()
    next(e for e in h.events if e["kind"] == "restored" and e["rank"] == 0)["torn"] = {"12": "EOFError: "}
    found = results(faulted(h))
    assert found[SAVE_RELOADS][0] == VIOLATED and "found the checkpoint of step 12 torn" in found[SAVE_RELOADS][1]
    assert found[NO_TORN][0] == found[NO_SCRATCH][0] == HELD


def test_a_user_s_save_to_the_final_path_lost_in_a_crash_breaks_a_finished_save_reloads():
    """torch.save straight to checkpoint.pt; the storage lost the last save: the workers
    resumed at step 4 from what the crash left."""
    saves = {4: (7, 40, 900), 8: (7, 80, 900), 12: (7, 120, 900)}
    found = results(faulted(with_checkpoint_files(user_job(resume_at=4), saves, (7, 999, 900))))
    assert found[SAVE_RELOADS][0] == VIOLATED and "save of step 12 left there" in found[SAVE_RELOADS][1]
    assert found[NO_TORN][0] == HELD


def test_a_resume_from_a_failed_save_and_one_from_scratch_are_named_apart():
    torn = faulted(with_saves(job_with_restore(), [("checkpoint_failed", 10)]))
    assert results(torn)[NO_TORN][0] == VIOLATED and results(torn)[NO_SCRATCH][0] == HELD
    scratch = faulted(with_saves(job_with_restore({r: (0, "w0", "m0") for r in range(4)}), [("checkpoint", 10)]))
    assert results(scratch)[NO_SCRATCH][0] == VIOLATED and results(scratch)[NO_TORN][0] == HELD


def test_ranks_that_resumed_at_different_steps_break_one_restored_step():
    events = faulted(job_with_restore({3: (5, "w5", "m5")}))
    assert results(events)[ONE_STEP][0] == VIOLATED


def failed_save_then(h: History, silent: int | None) -> list[dict]:
    """r0's save of step 10 fails (ENOSPC); the ranks go on, or `silent` records nothing after."""
    at = next(i for i, e in enumerate(h.events) if e["kind"] == "state" and e["step"] == 11)
    t = h.events[at - 1]["t"] + 0.001
    h.events.insert(at, {"t": t, "src": "rank", "rank": 0, "pid": 1000, "kind": "checkpoint_failed", "step": 10,
                         "errno": "ENOSPC", "error": "No space left on device"})
    events = faulted(h)
    if silent is not None:
        events = [e for e in events if not (e.get("rank") == silent and e["t"] > t)]
    events.append({"t": t + 30.0, "src": "harness", "rank": None, "kind": "trial_end", "reason": "settled"})
    return events


def test_a_failed_save_that_leaves_a_rank_silent_is_a_hang_on_the_storage_error():
    assert results(failed_save_then(job_with_restore(), None))[NO_HANG][0] == HELD
    result, detail = results(failed_save_then(job_with_restore(), silent=2))[NO_HANG]
    assert result == VIOLATED
    assert detail == "ENOSPC on r0's save of step 10; then r2 recorded nothing for 2.5 s: hung on it"
    # a user's job (no policy of the harness's) is given the hang cap
    job = dataclasses.replace(PLAN, policy_spec={}, job={"command": ["python", "train.py"]})
    events = failed_save_then(job_with_restore(), silent=2)
    assert storage_findings(events, job, check_state(events))[-1].detail.endswith("nothing for 15 s: hung on it")


def test_the_report_line_is_empty_without_a_storage_fault_and_counts_the_steps_lost():
    h = saved_job()
    assert storage_text(h.events, PLAN, check_state(h.events)) == ""
    events = faulted(h)
    text = storage_text(events, PLAN, check_state(events))
    assert text.startswith("a finished save reloads: held (4 restores after 3 saves); no torn save restored: held")
    assert "a storage error hangs no rank: not tested" in text and text.endswith("steps rolled back: 3 (most on one rank)")
