"""The state checker judges real 4-rank jobs: the harness's runner, restore and
checkpoints over real gloo on loopback, one rank failing once so that all restore, and a
defect planted in one rank's restore (tests/harness/planted/state_rank.py). Each defect
must come out diverged with its rank and step named; the job without one, consistent."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from chaos import proc
from harness.job.control import GENERATION_KEY
from reports.state import CONSISTENT, DIVERGED, REPLICAS_AGREE, RESTORE_IS_REAL, check_state
from runfolder.events import read_events

pytestmark = pytest.mark.system  # real gloo ranks on loopback: not in ./dev.sh check

RANK = Path(__file__).resolve().parent / "planted" / "state_rank.py"
WORLD, DEADLINE_S = 4, 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(folder: Path, defect: str) -> list[dict]:
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    store.set(GENERATION_KEY, "0")
    ranks = [subprocess.Popen([sys.executable, str(RANK), str(r), str(WORLD), str(port), str(folder), defect],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    deadline = time.monotonic() + DEADLINE_S
    try:
        for rank in ranks:
            rank.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # a defect that leaves ranks a step count apart can end in retries; judged all the same
    finally:
        for rank in ranks:
            proc.signal_tree(rank.pid, signal.SIGKILL, None, gone_ok=True)
            rank.wait()
        outputs = [rank.stdout.read() for rank in ranks]
        for rank in ranks:
            rank.stdout.close()
    events = read_events(folder / "events.jsonl")[0]
    assert any(e["kind"] == "restored" and e["gen"] == 1 for e in events), outputs
    return events


def test_the_job_without_a_defect_restores_for_real_and_stays_consistent(tmp_path):
    events = run_job(tmp_path, "none")
    verdict = check_state(events)
    assert verdict.verdict == CONSISTENT, verdict.summary()
    assert verdict.restores_checked == WORLD and verdict.ranks == WORLD
    assert set(verdict.rolled_back.values()) <= {2, 3}  # from 12 or 13 back to 10
    exits = [e["reason"] for e in events if e["kind"] == "exit"]
    assert exits == ["stopped"] * WORLD, exits


@pytest.mark.parametrize("defect, invariant, step", [
    ("older", REPLICAS_AGREE, 10),   # resumed at 5 while the others resumed at 10
    ("skip", REPLICAS_AGREE, 10),    # kept its own step 12 or 13
    ("torn", RESTORE_IS_REAL, 10),   # every rank loaded the one torn file
])
def test_a_planted_defect_is_caught_with_its_rank_and_step(tmp_path, defect, invariant, step):
    verdict = check_state(run_job(tmp_path, defect))
    assert verdict.verdict == DIVERGED, verdict.summary()
    first = verdict.first
    assert first.invariant == invariant and first.gen == 1, verdict.summary()
    if defect == "torn":
        assert first.step == step and "no rank recorded at that step" in first.detail
    else:
        assert first.ranks == ("2",) and f"at step {step}" in first.detail, verdict.summary()
    assert json.dumps(verdict.summary())  # one line for the report
