"""harness.trial.stacks against real processes: a host's process and the one it started in a
session of its own (as torchrun starts its workers), one of them stopped, read from outside."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chaos import proc
from harness.trial import stacks
from reports.stuck import read_stacks, stuck_summary
from runfolder.layout import STACKS_DIR, STACKS_INDEX
from tests.conftest import REPO

WORKER = "import sys, time\ndef worker_waits():\n    open(sys.argv[1], 'w').close()\n    time.sleep(120)\nworker_waits()"
HOST = f"""
import subprocess, sys, time
def start_worker():
    subprocess.Popen([sys.executable, "-c", {WORKER!r}, sys.argv[1]], start_new_session=True)
def host_waits():
    time.sleep(120)
start_worker()
host_waits()
"""


@pytest.fixture
def host(tmp_path):
    """A process that started a worker in a session of its own, both waiting in a known
    function; both killed at the end."""
    ready = tmp_path / "worker-ready"
    parent = subprocess.Popen([sys.executable, "-c", HOST, str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and parent.poll() is None, "the worker never started"
            time.sleep(0.05)
        time.sleep(0.2)  # into its sleep
        yield parent.pid
    finally:
        proc.signal_tree(parent.pid, signal.SIGKILL, None, gone_ok=True)
        parent.wait()


def test_every_process_of_a_host_is_dumped_with_its_frames_and_a_stopped_one_too(tmp_path, host):
    [(worker, _)] = proc.descendants(host)
    os.kill(worker, signal.SIGSTOP)
    index, secs = stacks.capture({3: host}, tmp_path / "trial")
    assert [(d.rank, d.pid, d.parent, d.error) for d in index] == [(3, host, None, None), (3, worker, host, None)]
    assert [d.stopped for d in index] == [False, True] and secs < stacks.DUMP_DEADLINE_S
    saved = json.loads((tmp_path / "trial" / STACKS_DIR / STACKS_INDEX).read_text())
    assert [entry["file"] for entry in saved] == [f"r003-{host}.json", f"r003-{worker}.json"]
    summary = stuck_summary(read_stacks(tmp_path / "trial"), [], 4)
    assert "1 rank in host_waits (<string>:6) <- <module> (<string>:8) (ranks 3)" in summary, summary
    assert "1 worker stopped (SIGSTOP) in worker_waits (<string>:4) <- <module> (<string>:5) (ranks 3)" in summary
    os.kill(worker, signal.SIGCONT)
    assert proc.state(host) in ("S", "R") and proc.state(worker) in ("S", "R")  # the read let them go


def test_without_py_spy_every_process_says_so(tmp_path, host, monkeypatch):
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    index, _ = stacks.capture({0: host}, tmp_path / "trial")
    assert len(index) == 2 and all(d.file is None and "py-spy is not installed" in d.error for d in index)
    summary = stuck_summary(read_stacks(tmp_path / "trial"), [], 1)
    assert summary.startswith("1 rank not dumped: py-spy is not installed (pip install py-spy) (ranks 0)"), summary


def test_a_rank_on_another_machine_is_indexed_as_not_read_and_never_dumped_by_its_pid(tmp_path, host, monkeypatch):
    # a Slurm node under another kernel: its pid names some other process here
    asked = []
    dump = stacks._dump
    monkeypatch.setattr(stacks, "_dump", lambda tool, pid, *a, **k: (asked.append(pid), dump(tool, pid, *a, **k))[1])
    why = "on node n7, another machine: py-spy and signals reach this machine's processes only"
    index, _ = stacks.capture({0: host}, tmp_path / "trial", elsewhere={1: (os.getpid(), why)})
    assert os.getpid() not in asked and [(d.rank, d.file is None, d.error) for d in index][-1] == (1, True, why)
    summary = stuck_summary(read_stacks(tmp_path / "trial"), [], 2)
    assert f"1 rank not dumped: {why} (ranks 1)" in summary, summary


def test_at_a_fault_s_first_detection_every_process_is_read_once_without_a_pause(tmp_path, host, monkeypatch):
    from reports.stuck import detect_summary
    read = []
    dump = stacks._dump
    monkeypatch.setattr(stacks, "_dump", lambda tool, pid, deadline_s, nonblocking, yielding: (
        read.append((nonblocking, yielding)), dump(tool, pid, deadline_s, nonblocking, yielding))[1])
    captured = []
    at = stacks.AtDetection(tmp_path / "trial", lambda index, entries, secs: captured.append((index, entries, secs)))
    at.poll([5.0], lambda: stacks.LiveRanks({3: host}))  # a detection, but no fault armed
    at.armed(0, 10.0)
    at.poll([5.0], lambda: stacks.LiveRanks({3: host}))  # before the fault: not its detection
    at.poll([5.0, 12.0], lambda: stacks.LiveRanks({3: host}))
    at.armed(0, 20.0)  # a pulsed fault's next on-phase: once per fault
    at.poll([5.0, 12.0, 21.0], lambda: stacks.LiveRanks({3: host}))
    at.join(stacks.DUMP_DEADLINE_S * 2)
    assert [(index, [d.error for d in entries]) for index, entries, _ in captured] == [(0, [None, None])]
    assert read == [(True, True)] * 2  # neither process paused for its read, nor its CPU taken
    events = [{"kind": "stacks_captured", "reason": "detect", "fault": 0, "t": 14.0, "secs": captured[0][2]}]
    summary = detect_summary(tmp_path / "trial", events, 4, t0=10.0)
    assert summary.startswith("at fault 0's first detection (+") and "1 rank in host_waits" in summary, summary
    assert read_stacks(tmp_path / "trial") is None  # the cap's folder is apart


@pytest.mark.requires_root
def test_a_real_trial_asked_for_stacks_at_detection_says_where_its_ranks_were(tmp_path):
    # scenarios/pause_rank.yaml on 4 ranks with stacks_at_detect: at the 5 s timeout rank 3
    # is still stopped, and the three others have just caught the timeout
    import yaml

    from tests.conftest import chaos_cli
    scenario = yaml.safe_load((REPO / "scenarios" / "pause_rank.yaml").read_text())
    scenario.update({"cluster": {"ranks": 4}, "stacks_at_detect": True, "expect": {},
                     "faults": [{"kind": "pause", "target": {"rank": 3}, "start": "1s", "duration": "8s"}]})
    path = tmp_path / "pause.yaml"
    path.write_text(yaml.safe_dump(scenario))
    done = chaos_cli("run", str(path), "--policy", "timeout", "--out", str(tmp_path / "runs"), "--quiet", timeout=180)
    assert done.returncode == 0, done.stderr
    [run] = (tmp_path / "runs").iterdir()
    assert (run / "trials" / "timeout" / STACKS_DIR / "detect-0" / STACKS_INDEX).is_file()
    report = (run / "report.md").read_text()
    line = next(line for line in report.splitlines() if "at each fault's first detection" in line)
    assert "at fault 0's first detection (+" in line and "stopped (SIGSTOP)" in line and "(ranks 3)" in line, line
