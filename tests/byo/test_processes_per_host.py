"""A user's job with several processes per host (nproc_per_host): each process counts.
The harness waits for the steps of every process, and "every live rank steps again" means
every process of the job, not one per host."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from chaos import proc
from harness.trial.orchestrator import Monitor
from reports.history import events_frame
from reports.metrics import trial_metrics
from runfolder import events as kinds
from runfolder.events import EventRecorder, schema_problems
from runfolder.layout import LOGS_DIR, TORCHRUN_LOGS_DIR, trial_dirs
from tests.byo.test_user_job_netns import events_of, metrics_row, no_process_left
from tests.conftest import chaos_cli
from tests.reports.report_fakes import FAULT_AT, PERIOD, History

PER_HOST = 2


def test_the_monitor_counts_the_host_process_that_stepped_least(tmp_path):
    path = tmp_path / "events.jsonl"
    monitor = Monitor(path, ranks=2, last_activity=0.0, per_host=PER_HOST)
    for rank in (0, 1):
        recorder = EventRecorder(path, kinds.RANK, rank=rank)
        for step in range(3):
            recorder.emit(kinds.STEP, step=step, gen=0, loss=None, dur=None, local_rank=0)
        recorder.close()
    monitor.poll()
    assert not monitor.all_made(3) and monitor.least_since() == 0  # local rank 1 made none yet
    recorder = EventRecorder(path, kinds.RANK, rank=0)
    for step in range(3):
        recorder.emit(kinds.STEP, step=step, gen=0, loss=None, dur=None, local_rank=1)
    monitor.poll()
    assert not monitor.all_made(3)  # rank 1's second process still made none
    EventRecorder(path, kinds.RANK, rank=1).emit(kinds.STEP, step=0, gen=0, loss=None, dur=None, local_rank=1)
    monitor.poll()
    assert monitor.all_made(1) and not monitor.all_made(2) and monitor.least_since() == 1


def two_hosts_two_processes(stalled: tuple[int, int] | None) -> dict:
    """A 15 s link fault on rank 1 from FAULT_AT; every process steps before it and after it
    healed, except `stalled` (rank, local rank), which never steps again."""
    h = History(ranks=2, policy="job")
    h.plan = dataclasses.replace(h.plan, policy_spec={}, job={"command": ["python", "train.py"],
                                                             "launcher": "torchrun", "nproc_per_host": PER_HOST})
    end = FAULT_AT + 15.0
    for rank in (0, 1):
        for local in range(PER_HOST):
            times = [i * PERIOD for i in range(int(FAULT_AT / PERIOD))]
            if (rank, local) != stalled:
                times += [end + 0.5 + i * PERIOD for i in range(8)]
            for step, t in enumerate(times):
                h.rank(rank, t + local * 0.01, "step", step=step, gen=0, loss=None, dur=None, local_rank=local)
    h.fault(targets=(1,), end=end)
    for rank in (0, 1):
        h.harness(end + 20.0, "rank_exited", rank=rank, pid=100 + rank, exitcode=None, signal=15, stopped=True)
    h.harness(end + 20.2, "trial_end", reason="deadline")
    events, trial = h.done()
    assert [p for e in events for p in schema_problems(e)] == []
    return trial_metrics(events_frame(events), trial)


def test_every_process_stepping_again_absorbs_the_fault():
    row = two_hosts_two_processes(stalled=None)
    assert row["outcome"] == "absorbed", row["outcome_reason"]


@pytest.mark.parametrize("stalled", [(1, 1), (0, 1)])
def test_one_process_that_never_steps_again_is_not_counted_as_its_host_resuming(stalled):
    row = two_hosts_two_processes(stalled)
    assert row["outcome"] == "inconclusive", row["outcome_reason"]
    assert "1 survivors never stepped again" in row["outcome_reason"]


def run_two_by_two(tmp_path: Path, fault: str) -> list[dict]:
    """examples/train_ddp.py under torchrun on 2 hosts x PER_HOST workers; its events, once
    no worker the hook saw start is left."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
    path = tmp_path / "job.yaml"
    path.write_text(f"""cluster: {{ranks: 2}}
job:
  command: [python, {example}, --step-period, "0.25", --checkpoint, "{{trial_dir}}/c.pt"]
  launcher: torchrun
  nproc_per_host: {PER_HOST}
  start_timeout: 240s
warmup_steps: 5
faults:
  - {fault}
hang_cap: 30s
settle_steps: 5
""")
    out = tmp_path / "out"
    done = chaos_cli("run", str(path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    events = events_of(out)
    workers = [e["pid"] for e in events if e["kind"] == "rank_start"]
    # a killed worker whose agent died with it is reparented to the machine's init, which
    # reaps it when it will: a zombie is gone, a process in any other state is left behind
    assert [pid for pid in workers if proc.state(pid) not in (None, "Z")] == []
    no_process_left(events)
    return events


@pytest.mark.requires_root
def test_two_hosts_with_two_torchrun_workers_each_make_a_world_of_four(tmp_path, leaves_nothing):
    events = run_two_by_two(tmp_path, "{kind: link_down, target: {rank: 1}, start: 1s, duration: 2s}")
    starts = [e for e in events if e["kind"] == "rank_start"]
    assert sorted((e["rank"], e["local_rank"]) for e in starts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {e["world"] for e in starts} == {2 * PER_HOST}
    warm = next(e["t"] for e in events if e["kind"] == "warmup_done")
    stepped = {(e["rank"], e["local_rank"]) for e in events if e["kind"] == "step" and e["t"] <= warm}
    assert stepped == {(0, 0), (0, 1), (1, 0), (1, 1)}  # warm-up waited for every process
    row = metrics_row(tmp_path / "out")
    assert row["outcome"] in ("absorbed", "recovered"), row["outcome_reason"]
    # each agent kept its log folder in the trial, not in a /tmp/torchelastic_* of its own
    [run_dir] = (tmp_path / "out").iterdir()
    [trial] = trial_dirs(run_dir)
    agent_logs = trial / LOGS_DIR / TORCHRUN_LOGS_DIR
    assert sorted(p.name for p in agent_logs.iterdir()) == ["r000", "r001"]
    assert all(any((agent_logs / host).iterdir()) for host in ("r000", "r001"))


@pytest.mark.requires_root
def test_a_kill_of_a_torchrun_host_ends_its_agent_and_its_workers(tmp_path, leaves_nothing):
    """A node's failure: the kill reaches the workers torchrun started in sessions of their own."""
    events = run_two_by_two(tmp_path, "{kind: kill, target: {rank: 1}, start: 1s}")
    [killed] = [e["t"] for e in events if e["kind"] == "fault_applied"]
    assert [e for e in events if e["kind"] == "step" and e["rank"] == 1 and e["t"] > killed + 0.5] == []
    row = metrics_row(tmp_path / "out")
    assert row["outcome"] == "crashed", row["outcome_reason"]
