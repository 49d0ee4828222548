"""The state checker's invariants on scripted event lists (reports.state); the same
checker judges real 4-rank jobs with planted defects in tests/harness/test_state_job.py."""
from __future__ import annotations

from reports.state import (CONSISTENT, DIVERGED, NOT_OBSERVED, PROGRESS_IS_HONEST, REPLICAS_AGREE,
                           RESTORE_IS_REAL, check_state)


class History:
    """A trial's events, written in order with a clock that ticks per event."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.t = 100.0

    def emit(self, kind: str, rank: int | None, **fields) -> None:
        self.t += 0.01
        self.events.append({"t": self.t, "src": "harness" if rank is None else "rank", "rank": rank,
                            "pid": 1000 + (rank or 0) + 100 * fields.pop("incarnation", 0), "kind": kind, **fields})

    def state(self, rank: int, step: int, gen: int, fp: str, at: str = "step", optim: str | None = "m", **kw) -> None:
        self.emit("state", rank, step=step, gen=gen, at=at, fingerprint=fp, optim=optim, **kw)

    def steps(self, ranks, first: int, last: int, gen: int, fp=lambda step: f"w{step}") -> None:
        for step in range(first, last + 1):
            for rank in ranks:
                self.state(rank, step, gen, fp(step), optim=f"m{step}")


def job_with_restore(restored: dict[int, tuple[int, str, str]] | None = None, source: str = "checkpoint") -> History:
    """4 ranks: steps 1-13 in gen 0, a failure, gen 1 resumes at checkpoint step 10, steps 11-15.
    `restored` overrides what a rank resumed from: rank -> (step, params, optim); `source`:
    where the restores read it (checkpoint | peer)."""
    h = History()
    for rank in range(4):
        h.state(rank, 0, 0, "w0", at="restore", optim="m0")
    h.steps(range(4), 1, 13, 0)
    h.emit("fault_applied", None, index=0, fault_kind="link_down", targets=[2])
    for rank in range(4):
        step, fp, optim = (restored or {}).get(rank, (10, "w10", "m10"))
        h.emit("restored", rank, step=step, gen=1, source=source)
        h.state(rank, step, 1, fp, at="restore", optim=optim)
    for step in range(11, 16):
        for rank in range(4):
            rstep, fp, _ = (restored or {}).get(rank, (10, "w10", "m10"))
            own = rstep + (step - 10)
            # a rank that resumed elsewhere keeps its own weights: they never match again
            h.state(rank, own, 1, f"w{own}" if (rstep, fp) == (10, "w10") else f"x{own}", optim=f"m{own}")
    return h


def test_no_fingerprints_is_not_observed():
    assert check_state([{"t": 1.0, "kind": "step", "rank": 0, "step": 1}]).verdict == NOT_OBSERVED


def test_a_clean_restore_is_consistent_and_counts_the_steps_rolled_back_and_repeated():
    verdict = check_state(job_with_restore().events)
    assert verdict.verdict == CONSISTENT, verdict.violations
    assert verdict.restores_checked == 4 and verdict.ranks == 4
    assert verdict.rolled_back == {str(r): 3 for r in range(4)}  # 13 -> 10
    assert verdict.repeated == {str(r): 3 for r in range(4)}     # 11, 12, 13 again
    assert "consistent" in verdict.summary()


def test_one_rank_restoring_an_older_checkpoint_is_named_with_its_step():
    verdict = check_state(job_with_restore({3: (5, "w5", "m5")}).events)
    assert verdict.verdict == DIVERGED
    first = verdict.first
    assert first.invariant == REPLICAS_AGREE and first.ranks == ("3",) and first.gen == 1
    assert "rank 3 at step 5" in first.detail and "ranks 0,1,2 at step 10" in first.detail
    assert "restored" in verdict.context and "rank 3" in verdict.context


def test_one_rank_skipping_the_restore_resumes_where_it_was():
    verdict = check_state(job_with_restore({1: (13, "w13", "m13")}).events)
    assert verdict.first.invariant == REPLICAS_AGREE and verdict.first.ranks == ("1",)
    assert "rank 1 at step 13" in verdict.first.detail


def test_a_torn_checkpoint_is_a_state_nobody_recorded():
    verdict = check_state(job_with_restore({r: (10, "torn", "m10") for r in range(4)}).events)
    assert verdict.verdict == DIVERGED
    assert {v.invariant for v in verdict.violations} == {RESTORE_IS_REAL}  # every rank loaded the same file
    assert "no rank recorded at that step" in verdict.first.detail and "step 10" in verdict.first.detail


def test_weights_restored_without_the_optimizer_state_is_not_a_real_restore():
    verdict = check_state(job_with_restore({r: (10, "w10", "fresh") for r in range(4)}).events)
    assert verdict.first.invariant == RESTORE_IS_REAL and "optimizer" in verdict.first.detail


def test_replicas_that_disagree_at_a_step_are_grouped_by_fingerprint():
    h = History()
    h.steps(range(4), 1, 5, 0, fp=lambda s: f"w{s}")
    h.state(2, 6, 0, "odd", optim="m6")
    for rank in (0, 1, 3):
        h.state(rank, 6, 0, "w6", optim="m6")
    verdict = check_state(h.events)
    assert verdict.first.invariant == REPLICAS_AGREE and verdict.first.step == 6 and verdict.first.ranks == ("2",)
    assert "ranks 0,1,3 w6" in verdict.first.detail and "rank 2 odd" in verdict.first.detail


def test_ranks_of_another_generation_are_not_compared():
    h = History()
    h.steps(range(4), 1, 3, 0)
    h.state(3, 4, 0, "alone")  # rank 3 left out, still in gen 0
    h.steps(range(3), 4, 5, 1, fp=lambda s: f"v{s}")
    assert check_state(h.events).verdict == CONSISTENT


def test_a_step_counter_going_back_without_a_resume_is_not_honest_progress():
    h = History()
    h.steps(range(2), 1, 4, 0)
    h.state(0, 2, 0, "w2", optim="m2")
    h.state(1, 2, 0, "w2", optim="m2")
    verdict = check_state(h.events)
    assert {v.invariant for v in verdict.violations} == {PROGRESS_IS_HONEST}


def user_job(reinit_rank: int | None = None, resume_at: int = 10, steps_after: int = 3,
             weights_only_rank: int | None = None) -> History:
    """torchrun: 4 workers, gen 0 steps 1-13 (counted by the hook), restart, gen 1 workers
    start from the checkpoint of step `resume_at` (`weights_only_rank` without its optimizer
    state) and count their steps from 1 again, `steps_after` of them."""
    h = History()
    for rank in range(4):
        h.state(rank, 0, 0, "w0", at="start", optim=None)
    h.steps(range(4), 1, 13, 0)
    for rank in range(4):
        h.emit("rank_start", rank, policy="job", world=4, incarnation=1)
        fp, optim = ("w0", None) if rank == reinit_rank else (f"w{resume_at}", f"m{resume_at}")
        h.state(rank, 0, 1, fp, at="start", optim=None if rank == weights_only_rank else optim, incarnation=1)
    for step in range(1, 1 + steps_after):
        for rank in range(4):
            fp = f"r{step}" if rank == reinit_rank else f"w{resume_at + step}"
            h.state(rank, step, 1, fp, optim=f"m{resume_at + step}", incarnation=1)
    return h


def test_a_user_job_restart_that_resumed_is_consistent_and_finds_its_step():
    verdict = check_state(user_job().events)
    assert verdict.verdict == CONSISTENT, verdict.violations
    assert verdict.rolled_back == {str(r): 3 for r in range(4)} and verdict.restores_checked == 4


def test_a_user_job_whose_rank_3_reinitialises_on_restart_is_named():
    verdict = check_state(user_job(reinit_rank=3).events)
    assert verdict.verdict == DIVERGED
    first = verdict.first
    assert first.invariant == REPLICAS_AGREE and first.ranks == ("3",) and "start of generation 1" in first.detail
    assert "rank_start" in verdict.context


def test_a_diverged_state_fails_any_expectation_unless_it_is_the_one_expected():
    from reports.expect import check_expectations
    from runfolder.plan import Expectation
    diverged = {"outcome": "recovered", "state": "diverged", "state_detail": "state diverged: replicas agree: ..."}
    [failure] = check_expectations(diverged, Expectation(outcome=("recovered",)))
    assert failure == "state: expected not diverged, measured state diverged: replicas agree: ..."
    assert check_expectations(diverged, Expectation(state="diverged")) == []
    assert check_expectations({"state": "not observed"}, Expectation(state="consistent")) == [
        "state: expected consistent, measured not observed"]


def test_a_scenario_expects_a_state_and_the_plan_says_so(tmp_path):
    from harness.scenario.scenario import load_scenario
    from harness.trial.plan import build_plan
    path = tmp_path / "s.yaml"
    path.write_text("cluster: {ranks: 4}\nfaults: [{kind: kill, target: {rank: 1}, start: 1s}]\n"
                    "policies: {retry: {}}\nexpect: {retry: {state: consistent}}\n")
    plan = build_plan(load_scenario(path), "retry")
    assert plan.trial.expect.state == "consistent"
    path.write_text(path.read_text().replace("state: consistent", "state: fine"))
    try:
        load_scenario(path)
    except Exception as exc:  # one line naming the file, the field and the accepted values
        assert "state" in str(exc) and "consistent" in str(exc) and str(path) in str(exc)
    else:
        raise AssertionError("an unknown state verdict was accepted")


def test_a_rank_started_again_by_a_wrapper_is_compared_with_its_own_epoch_not_the_first():
    """The direct launcher, rank 1's process started again by the user's wrapper (same
    generation 0, steps counted from 0 again) from the checkpoint of step 10."""
    h = History()
    for rank in range(2):
        h.state(rank, 0, 0, "w0", at="start", optim=None)
    h.steps(range(2), 1, 12, 0)
    h.state(1, 0, 0, "w10", at="start", optim="m10", incarnation=1)
    for step in range(1, 3):
        h.state(1, step, 0, f"w{10 + step}", optim=f"m{10 + step}", incarnation=1)
    verdict = check_state(h.events)
    assert verdict.verdict == CONSISTENT, verdict.violations
    assert verdict.restores_checked == 1 and verdict.rolled_back == {"1": 2}


def test_shards_are_not_compared_across_ranks_but_each_restores_its_own():
    h = History()
    for rank in range(2):  # FSDP: each rank's parameters and optimizer state are its own shard
        h.state(rank, 0, 0, f"s{rank}.0", at="restore", optim=None, sharded="params")
    for step in range(1, 6):
        for rank in range(2):
            h.state(rank, step, 0, f"s{rank}.{step}", optim=f"m{rank}.{step}", sharded="params")
    h.state(0, 3, 1, "s0.3", at="restore", optim="m0.3", sharded="params")
    h.state(1, 3, 1, "s0.3", at="restore", optim="m0.3", sharded="params")  # rank 1 loaded rank 0's shard
    verdict = check_state(h.events)
    assert [v.invariant for v in verdict.violations] == [RESTORE_IS_REAL] and verdict.first.ranks == ("1",)
    zero = History()  # ZeroRedundancyOptimizer: parameters replicated, optimizer state sharded
    for step in range(1, 4):
        for rank in range(2):
            zero.state(rank, step, 0, f"w{step}", optim=f"m{rank}.{step}", sharded="optim")
    assert check_state(zero.events).verdict == CONSISTENT
    zero.state(0, 4, 0, "w4", optim="m0.4", sharded="optim")
    zero.state(1, 4, 0, "x4", optim="m1.4", sharded="optim")
    assert check_state(zero.events).first.ranks in (("0",), ("1",))


def test_at_one_instant_the_rank_that_did_not_restore_comes_before_the_replicas_it_splits():
    """rank 3 is the last to record its start of generation 1, with the weights but not
    the optimizer's state: both invariants fail at that one event, and the cause leads."""
    verdict = check_state(user_job(steps_after=0, weights_only_rank=3).events)
    assert {v.invariant for v in verdict.violations} >= {RESTORE_IS_REAL, REPLICAS_AGREE}
    assert verdict.first.invariant == RESTORE_IS_REAL and verdict.first.ranks == ("3",)


def with_saves(h: History, saves: list[tuple[str, int]]) -> History:
    """`h` with rank 0's checkpoint events (kind, step) written just after its step 10."""
    at = next(i for i, e in enumerate(h.events) if e["kind"] == "state" and e["step"] == 11)
    h.events[at:at] = [{"t": h.events[at - 1]["t"] + 0.001 * (i + 1), "src": "rank", "rank": 0, "pid": 1000,
                        "kind": kind, "step": step} for i, (kind, step) in enumerate(saves)]
    return h


def test_a_resume_from_scratch_after_a_checkpoint_was_written_is_not_a_real_restore():
    scratch = {rank: (0, "w0", "m0") for rank in range(4)}
    verdict = check_state(with_saves(job_with_restore(scratch), [("checkpoint", 10)]).events)
    assert verdict.verdict == DIVERGED
    assert verdict.first.invariant == RESTORE_IS_REAL
    assert "from scratch" in verdict.first.detail and "checkpoint of step 10" in verdict.first.detail
    # the same resume with no checkpoint written yet is the only state there is
    assert check_state(job_with_restore(scratch).events).verdict == CONSISTENT


def test_a_resume_from_a_save_that_failed_is_a_torn_checkpoint():
    verdict = check_state(with_saves(job_with_restore(), [("checkpoint_failed", 10)]).events)
    assert verdict.verdict == DIVERGED and verdict.first.invariant == RESTORE_IS_REAL
    assert "whose save failed" in verdict.first.detail
    # a failed save of another step, the one restored written: consistent
    fine = with_saves(job_with_restore(), [("checkpoint", 10), ("checkpoint_failed", 5)])
    assert check_state(fine.events).verdict == CONSISTENT


def test_a_resume_from_a_peer_at_the_step_of_a_failed_save_read_no_checkpoint():
    # found by `chaos explore` (elastic, 16 ranks): a read-only checkpoint folder failed the
    # save of step 20, the saving rank was killed during it, and the survivors took step 20
    # from a peer's memory: the state they resumed is real, and judged as such
    peer = with_saves(job_with_restore(source="peer"), [("checkpoint_failed", 10)])
    assert check_state(peer.events).verdict == CONSISTENT
    wrong = with_saves(job_with_restore({3: (10, "x10", "m10")}, source="peer"), [("checkpoint_failed", 10)])
    verdict = check_state(wrong.events)
    assert verdict.verdict == DIVERGED and "whose save failed" not in verdict.first.detail


def test_a_user_job_that_starts_over_though_it_saved_a_checkpoint_is_named():
    h = user_job(resume_at=0)
    for e in h.events:  # every worker starts from the initial state, its optimizer's empty
        if e["kind"] == "state" and e["at"] == "start":
            e["optim"] = None
    first_restart = next(i for i, e in enumerate(h.events) if e["kind"] == "rank_start")
    h.events.insert(first_restart, {"t": h.events[first_restart - 1]["t"] + 0.001, "src": "rank", "rank": 0,
                                    "pid": 1000, "kind": "checkpoint_save", "step": 13})
    verdict = check_state(h.events)
    assert verdict.verdict == DIVERGED and verdict.first.invariant == RESTORE_IS_REAL
    assert "from scratch" in verdict.first.detail and "a checkpoint was written" in verdict.first.detail


def file_of(identity: tuple[int, int, int]) -> dict[str, int]:
    ino, mtime_ns, size = identity
    return {"ino": ino, "mtime_ns": mtime_ns, "size": size}


def with_checkpoint_files(h: History, saved: dict[int, tuple[int, int, int]], read: tuple[int, int, int]) -> History:
    """`h` (a user_job) with rank 0's saves (step -> inode, mtime, size of the file it left)
    before the restart, and each restarted worker's load of checkpoint.pt as `read`."""
    restart = next(i for i, e in enumerate(h.events) if e["kind"] == "rank_start")
    t = h.events[restart - 1]["t"]
    h.events[restart:restart] = [
        {"t": t - 0.001 * (len(saved) - i), "src": "rank", "rank": 0, "pid": 1000, "kind": "checkpoint_save",
         "step": step, "path": "/trial/ckpt/checkpoint.pt.tmp", "file": file_of(f)}
        for i, (step, f) in enumerate(sorted(saved.items()))]
    for rank in range(4):
        start = next(i for i, e in enumerate(h.events) if e["kind"] == "state" and e["at"] == "start"
                     and e["rank"] == rank and e["pid"] >= 1100)
        h.events.insert(start, {"t": h.events[start]["t"] - 0.0001, "src": "rank", "rank": rank,
                                "pid": h.events[start]["pid"], "kind": "checkpoint_load",
                                "path": "/trial/ckpt/checkpoint.pt", "file": file_of(read)})
    return h


def test_a_load_of_what_no_save_left_names_the_save_lost_and_the_step_resumed_at():
    saves = {4: (7, 40, 900), 8: (7, 80, 900), 12: (7, 120, 900)}  # torch.save to the final path
    # the crash put back the file of step 4 (a new mtime, the same inode and size): resumed there
    verdict = check_state(with_checkpoint_files(user_job(resume_at=4), saves, (7, 999, 900)).events)
    assert verdict.verdict == DIVERGED and verdict.first.invariant == RESTORE_IS_REAL
    assert verdict.first.ranks == ("0", "1", "2", "3") and verdict.first.step == 12
    assert ("loaded ckpt/checkpoint.pt, 900 bytes, not what rank 0's save of step 12 left there" in verdict.first.detail
            and "resumed at step 4 (8 steps lost)" in verdict.first.detail)
    # the file the last save left, read whole: a real restore
    assert check_state(with_checkpoint_files(user_job(resume_at=12), saves, (7, 120, 900)).events).verdict == CONSISTENT


def test_an_empty_file_that_no_restarted_worker_could_load_is_named():
    h = with_checkpoint_files(user_job(resume_at=8), {4: (5, 40, 900), 8: (6, 80, 900)}, (6, 999, 0))
    h.events = [e for e in h.events if not (e["kind"] == "state" and e["pid"] >= 1100)]  # torch.load raised
    verdict = check_state(h.events)
    assert verdict.verdict == DIVERGED and verdict.first.invariant == RESTORE_IS_REAL
    assert "checkpoint.pt, empty (0 bytes), not what rank 0's save of step 8 left there (900 bytes" in verdict.first.detail
    assert "no process that loaded it stepped after (4 loads): it could not be loaded" in verdict.first.detail
    # a file of another inode (not one the job saved: pretrained weights) is not judged here
    other = with_checkpoint_files(user_job(resume_at=8), {8: (6, 80, 900)}, (3, 999, 0))
    assert check_state(other.events).verdict == CONSISTENT


def test_a_restore_past_an_unreadable_checkpoint_says_so_and_the_steps_lost():
    h = job_with_restore()
    restored = next(e for e in h.events if e["kind"] == "restored" and e["rank"] == 0)
    restored["unreadable"] = {"12": "OSError: [Errno 5] Input/output error"}
    verdict = check_state(h.events)
    assert verdict.verdict == CONSISTENT
    assert verdict.skipped == ((10, 12, "unreadable", "OSError: [Errno 5] Input/output error"),)
    assert verdict.summary().endswith("4 resumed states real); restored step 10 past the unreadable checkpoint of "
                                      "step 12 (OSError: [Errno 5] Input/output error); steps lost: 3 on ranks 0,1,2,3")


def saved_job(steps=(5, 10, 12)) -> History:
    """job_with_restore with the runner's saves recorded, each durable by its word."""
    h = job_with_restore()
    for step in steps:
        h.events.insert(next(i for i, e in enumerate(h.events) if e["kind"] == "state" and e["step"] == step + 1),
                        {"t": 0, "src": "rank", "rank": 0, "pid": 1000, "kind": "checkpoint", "step": step})
    for i, e in enumerate(h.events):  # inserted events take their neighbour's time
        e["t"] = e["t"] or h.events[i + 1]["t"] - 0.001
    return h


def test_a_restore_that_found_every_durable_save_torn_is_a_lost_save_not_a_clean_crash():
    h = saved_job()
    rank0 = next(i for i, e in enumerate(h.events) if e["kind"] == "restored" and e["rank"] == 0)
    h.events[rank0:] = [{**h.events[rank0], "kind": "restore_failed",
                         "torn": {"12": "EOFError: ", "10": "EOFError: ", "5": "EOFError: "}}]
    del h.events[rank0]["step"]
    verdict = check_state(h.events)
    assert verdict.verdict == DIVERGED and verdict.first.invariant == RESTORE_IS_REAL
    assert verdict.first.detail.startswith("rank 0 found the checkpoint of step 12 torn (EOFError: ), though")
    assert verdict.first.detail.endswith("no checkpoint could be read: the restore failed")


def test_a_restore_past_a_torn_checkpoint_whose_save_had_finished_is_a_lost_save():
    h = saved_job()
    restored = next(e for e in h.events if e["kind"] == "restored" and e["rank"] == 0)
    restored["torn"] = {"12": "RuntimeError: PytorchStreamReader failed reading zip archive"}
    verdict = check_state(h.events)
    assert verdict.verdict == DIVERGED and verdict.first.invariant == RESTORE_IS_REAL
    assert verdict.first.detail.startswith("rank 0 found the checkpoint of step 12 torn (RuntimeError: ")
    assert verdict.first.detail.endswith("that save was lost; the job resumed at step 10 (2 steps lost)")


def test_ranks_whose_processes_share_a_pid_are_told_apart_by_their_rank():
    """On the docker backend every rank's process is its container's pid 1: one rank's steps
    are not another's, whatever their pid says."""
    h = job_with_restore()
    for e in h.events:
        e["pid"] = 1
    verdict = check_state(h.events)
    assert verdict.verdict == CONSISTENT, verdict.violations
