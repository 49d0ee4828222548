"""harness.job.flight in real gloo ranks: asked with SIGUSR2 at a hang, each rank dumps the
collectives it entered, and the report names the rank that did not enter the last one."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from chaos import proc
from harness.trial.stacks import ask_flight_recorders, recording_ranks
from reports.stuck import flight_text, read_flight

pytestmark = pytest.mark.system  # real gloo ranks on loopback: not in ./dev.sh check

RANK = """
import datetime, sys, time
from pathlib import Path
import torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
from harness.job import flight

rank, port, trial = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
assert flight.install(trial, rank)
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
group = dist.ProcessGroupGloo(dist.PrefixStore("gen0/", store), rank, 3, datetime.timedelta(seconds=60))
options = dist.AllreduceOptions()
for _ in range(4):
    group.allreduce([torch.ones(8)], options).wait()
if rank != 2:  # rank 2 stays out of the fifth: the others wait in it
    work = group.allreduce([torch.ones(8)], options)
print("ready", flush=True)
while True:  # as the harness's collective wait does: sleeps in slices
    time.sleep(0.02)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_did_not_enter_the_collective_is_named(tmp_path):
    from tests.conftest import REPO
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    code = RANK.format(repo=str(REPO))
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r), str(port), str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env={"GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}) for r in range(3)]
    try:
        assert [r.stdout.readline().strip() for r in ranks] == ["ready"] * 3
        pids = {rank: p.pid for rank, p in enumerate(ranks)}
        events = [{"kind": "rank_start", "rank": rank, "pid": pid, "flight": True} for rank, pid in pids.items()]
        assert recording_ranks(events + [{"kind": "rank_start", "rank": 9, "pid": 1}], pids) == pids
        assert ask_flight_recorders(pids, tmp_path) == [0, 1, 2]
        assert all(p.poll() is None for p in ranks)  # asked, not stopped
        assert flight_text(read_flight(tmp_path), pids) == (
            "flight recorder: collective 5 (gloo:all_reduce) of group 0 entered by ranks 0,1; "
            "rank 2 did not enter it (its last: 4)")
    finally:
        for p in ranks:
            proc.signal_tree(p.pid, signal.SIGKILL, None, gone_ok=True)
            p.wait()
            p.stdout.close()
        del store


def test_nccl_s_recorder_is_read_beside_the_cpu_one(monkeypatch):
    # A CUDA build keeps NCCL's collectives in a recorder of its own (_dump_nccl_trace): on
    # the first GPU run the CPU recorder held none of a NCCL group's. Its dump is faked here
    # (a CPU build has none); the real one is read by bench/gpu_nccl_one.py on a GPU.
    import pickle

    import torch

    from harness.job import flight
    nccl = {"entries": [{"pg_id": 1, "collective_seq_id": 3, "profiling_name": "nccl:all_reduce",
                         "input_sizes": [[8]], "time_created_ns": 5, "state": "completed"}],
            "pg_status": {"1": {"last_enqueued_collective": 3}}}
    monkeypatch.setattr(torch._C._distributed_c10d, "_dump_nccl_trace",
                        lambda includeCollectives, includeStackTraces: pickle.dumps(nccl), raising=False)
    got = flight.entries()
    assert got["entries"][-1] == {"pg_id": 1, "collective_seq_id": 3, "profiling_name": "nccl:all_reduce",
                                  "input_sizes": [[8]], "time_created_ns": 5}
    assert got["pg_status"]["1"] == {"last_enqueued_collective": 3}
