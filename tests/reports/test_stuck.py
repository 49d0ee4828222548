"""reports.stuck on scripted stacks folders: grouping, roles, own code, ranks gone."""
from __future__ import annotations

import json
from pathlib import Path

from reports.stuck import read_stacks, stuck_summary
from runfolder.layout import STACKS_DIR, STACKS_INDEX

SITE = "/venv/lib/python3.11/site-packages"


def frame(name: str, filename: str, line: int) -> dict:
    return {"name": name, "filename": filename, "short_filename": filename.rsplit("/", 1)[-1], "line": line}


IN_ALL_REDUCE = [frame("GlooGroup._wait", "/repo/harness/job/group.py", 262),
                 frame("GlooGroup.all_reduce", "/repo/harness/job/group.py", 236),
                 frame("Workload.train_step", "/repo/harness/job/workload.py", 54)]
IN_DDP = [frame("_sync_buckets", f"{SITE}/torch/nn/parallel/distributed.py", 1900),
          frame("backward", f"{SITE}/torch/_tensor.py", 623),
          frame("main", "/work/examples/train_ddp.py", 92)]
IN_RENDEZVOUS = [frame("_delay", f"{SITE}/torch/distributed/elastic/rendezvous/utils.py", 181),
                 frame("_DistributedRendezvousOpExecutor.run", f"{SITE}/torch/distributed/elastic/rendezvous/"
                       "dynamic_rendezvous.py", 685), frame("<module>", "/venv/bin/torchrun", 8)]


def stacks(trial: Path, entries: list[tuple[int, int, int | None, str, list | None]]) -> Path:
    folder = trial / STACKS_DIR
    folder.mkdir(parents=True)
    index = []
    for rank, pid, parent, command, frames in entries:
        name = None
        if frames is not None:
            name = f"r{rank:03d}-{pid}.json"
            helper = {"thread_name": "Thread-1", "os_thread_id": pid + 1, "frames": [frame("wait", "/x.py", 1)]}
            (folder / name).write_text(json.dumps([helper, {"thread_name": "MainThread", "os_thread_id": pid,
                                                            "frames": frames}]))
        index.append({"rank": rank, "pid": pid, "parent": parent, "command": command, "file": name,
                      "error": None if frames is not None else "py-spy did not finish within 10 s"})
    (folder / STACKS_INDEX).write_text(json.dumps(index))
    return trial


def test_ranks_waiting_in_one_place_are_one_group_with_their_own_frame(tmp_path):
    entries = [(r, 100 + r, None, "python -m harness.job.rank", IN_ALL_REDUCE) for r in range(16) if r != 5]
    summary = stuck_summary(read_stacks(stacks(tmp_path, entries)), [], 16)
    assert summary == ("15 ranks in all_reduce: GlooGroup._wait (group.py:262) <- GlooGroup.all_reduce "
                       "(group.py:236); own code: Workload.train_step (workload.py:54) (ranks 0-4,6-15)")


def test_a_rank_caught_elsewhere_in_the_same_wait_joins_its_group_and_another_call_site_does_not(tmp_path):
    in_callee = IN_ALL_REDUCE[1:]  # py-spy read rank 7 between the wait's loop and its callee
    in_eval = IN_ALL_REDUCE[:2] + [frame("Workload.evaluate", "/repo/harness/job/workload.py", 80)]
    entries = [(r, 100 + r, None, "python -m harness.job.rank",
                in_callee if r == 7 else in_eval if r == 9 else IN_ALL_REDUCE) for r in range(16)]
    summary = stuck_summary(read_stacks(stacks(tmp_path, entries)), [], 16)
    assert summary == ("15 ranks in all_reduce: GlooGroup._wait (group.py:262) <- GlooGroup.all_reduce "
                       "(group.py:236); own code: Workload.train_step (workload.py:54) (ranks 0-8,10-15; 7 caught at "
                       "GlooGroup.all_reduce (group.py:236) <- Workload.train_step (workload.py:54)); "
                       "1 rank in all_reduce: GlooGroup._wait (group.py:262) <- GlooGroup.all_reduce (group.py:236); "
                       "own code: Workload.evaluate (workload.py:80) (ranks 9)")


def test_torchrun_agents_wait_in_rendezvous_for_their_nodes_and_the_killed_host_is_named(tmp_path):
    entries = [(r, 100 + r, None, "/venv/bin/python /venv/bin/torchrun --nnodes=8 ...", IN_RENDEZVOUS)
               for r in range(8) if r != 6]
    events = [{"t": 10.0, "kind": "fault_applied", "fault_kind": "kill", "targets": [6]},
              {"t": 10.02, "kind": "rank_exited", "rank": 6, "signal": 9.0, "exitcode": float("nan"),
               "stopped": float("nan")},  # as a DataFrame gives them back
              {"t": 30.0, "kind": "stacks_captured"},
              {"t": 31.0, "kind": "rank_exited", "rank": 0, "signal": None, "exitcode": 1, "stopped": True}]
    summary = stuck_summary(read_stacks(stacks(tmp_path, entries)), events, 8, t0=10.0)
    assert summary.startswith("7 torchrun agents in rendezvous for 8 nodes (--nnodes): _delay (utils.py:181)")
    assert summary.endswith("(ranks 0-5,7); rank 6 gone: SIGKILL (the kill fault at +0.0 s)")
    assert "own code" not in summary and "rank 0 gone" not in summary  # stopped by the harness after the capture


def test_ranks_gone_alike_are_one_clause_and_an_exit_code_is_a_number():
    from reports.stuck import gone_text
    events = [{"t": 10.0, "kind": "fault_applied", "fault_kind": "pause", "targets": [5]}]
    events += [{"t": 20.0 + r / 100, "kind": "rank_exited", "rank": r, "signal": float("nan"), "exitcode": 1.0,
                "stopped": float("nan")} for r in (3, 1, 5, 2, 7, 6)]  # as a DataFrame gives them back
    assert gone_text(events, t0=10.0) == ["ranks 1-3,6,7 gone: exit 1", "rank 5 gone: exit 1 (the pause fault at "
                                             "+0.0 s)"]


def test_workers_under_agents_and_processes_not_dumped_are_listed(tmp_path):
    entries = [(0, 100, None, "torchrun --nnodes=2", IN_RENDEZVOUS), (0, 101, 100, "python train_ddp.py", IN_DDP),
               (1, 200, None, "torchrun --nnodes=2", IN_RENDEZVOUS), (1, 201, 200, "python train_ddp.py", None)]
    summary = stuck_summary(read_stacks(stacks(tmp_path, entries)), [], 2)
    assert "2 torchrun agents in rendezvous for 2 nodes" in summary
    assert ("1 worker in _sync_buckets (distributed.py:1900) <- backward (_tensor.py:623); own code: main "
            "(train_ddp.py:92) (ranks 0)") in summary
    assert "1 worker not dumped: py-spy did not finish within 10 s (ranks 1)" in summary


def test_a_paused_rank_is_named_and_a_trial_without_stacks_says_nothing(tmp_path):
    trial = stacks(tmp_path / "a", [(r, 100 + r, None, "python", IN_ALL_REDUCE) for r in range(4)])
    index = json.loads((trial / STACKS_DIR / STACKS_INDEX).read_text())
    index[2]["stopped"] = True
    (trial / STACKS_DIR / STACKS_INDEX).write_text(json.dumps(index))
    summary = stuck_summary(read_stacks(trial), [], 4)
    assert summary.startswith("3 ranks in all_reduce: ") and "(ranks 0,1,3)" in summary
    assert "1 rank stopped (SIGSTOP) in all_reduce: " in summary and summary.endswith("(ranks 2)")
    assert read_stacks(tmp_path / "none") is None and stuck_summary(None, [], 4) == ""


def entry(pg: int, seq: int, op: str = "gloo:all_reduce") -> dict:
    return {"pg_id": pg, "collective_seq_id": seq, "profiling_name": op}


def test_the_flight_recorders_say_which_rank_did_not_enter_the_newest_collective():
    from reports.stuck import flight_text
    flight = {r: [entry(0, s) for s in range(1, 58)] for r in range(4)}
    flight[2] = flight[2][:-1]  # rank 2 never entered collective 57
    assert flight_text(flight, asked=range(5)) == ("flight recorder: collective 57 (gloo:all_reduce) of group 0 "
                                                   "entered by ranks 0,1,3; rank 2 did not enter it (its last: 56); "
                                                   "rank 4 did not answer")
    moved_on = {0: [entry(0, 9), entry(1, 3)], 1: [entry(0, 9), entry(1, 3)], 2: [entry(0, 9)]}
    assert flight_text(moved_on) == ("flight recorder: collective 3 (gloo:all_reduce) of group 1 entered by "
                                     "ranks 0,1; ranks 2 in another group")
    assert flight_text({}) == "" and flight_text({}, asked=[1]) == "flight recorder: no entries; rank 1 did not answer"


def test_a_dump_that_came_after_the_deadline_is_not_taken_for_the_cap_s():
    # a stopped rank answers only when teardown continues it: its file is of a later state
    from reports.stuck import stuck_summary
    flight = {r: [entry(0, s) for s in range(1, 16)] for r in range(3)}
    flight[3] = [entry(0, s) for s in range(1, 15)]
    captured = {"kind": "stacks_captured", "reason": "hung", "t": 30.0, "flight": [0, 1, 2, 3]}
    late = stuck_summary([], [{**captured, "flight_answered": [0, 1, 2]}], 4, flight=flight)
    assert late.endswith("entered by ranks 0-2; rank 3 did not answer"), late
    older = stuck_summary([], [captured], 4, flight=flight)  # a run folder from before the field
    assert older.endswith("entered by ranks 0-2; rank 3 did not enter it (its last: 14)"), older


def test_a_rank_gone_is_put_down_to_the_newest_fault_on_it_before_it_went():
    """A pause it survived at +0 s, then the kill at +43 s that ended it."""
    from reports.stuck import gone_text
    events = [{"t": 10.0, "kind": "fault_applied", "fault_kind": "pause", "targets": [5]},
              {"t": 28.0, "kind": "fault_applied", "fault_kind": "link_down", "targets": [5]},
              {"t": 53.0, "kind": "fault_applied", "fault_kind": "kill", "targets": [5]},
              {"t": 53.1, "kind": "rank_exited", "rank": 5, "signal": 9, "exitcode": -9, "stopped": False}]
    assert gone_text(events, t0=10.0) == ["rank 5 gone: SIGKILL (the kill fault at +43.0 s)"]
