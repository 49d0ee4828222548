"""The fault-free trajectory (harness.job.reference) is what real gloo ranks record: 4
processes train the built-in workload over a real gloo group on loopback."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from harness.job.config import WorkloadSpec
from harness.job.reference import fault_free_losses, order_spread
from reports.trajectory import TOLERANCE
from tests.conftest import REPO

pytestmark = pytest.mark.system  # real gloo ranks on loopback: not in ./dev.sh check

RANKS = """
import datetime, json, os, sys
import torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
from harness.job.config import WorkloadSpec
from harness.job.workload import Workload

rank, port = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
group = dist.ProcessGroupGloo(store, rank, 4, datetime.timedelta(seconds=60))
workload = Workload(WorkloadSpec(), seed=7, rank=rank)
losses = [round(workload.train_step(lambda t: group.allreduce([t]).wait(), 4), 5) for _ in range(12)]
print(json.dumps(losses), flush=True)
# out at once: tearing the group down at interpreter exit can abort in gloo's threads
# ("terminate called without an active exception", once in CI), and an abort loses what
# is still buffered
os._exit(0)
"""


def test_the_reference_is_what_real_gloo_ranks_record():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    code = RANKS.format(repo=str(REPO))
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r), str(port)], stdout=subprocess.PIPE, text=True,
                              env={"GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}) for r in range(4)]
    try:
        recorded = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
        del store
    reference = fault_free_losses(WorkloadSpec(), seed=7, world=4, steps=12)
    gaps = [abs(a - b) for r in range(4) for a, b in zip(recorded[r], reference[r], strict=True)]
    assert max(gaps) <= TOLERANCE, max(gaps)
    assert recorded[0] != recorded[1]  # each rank's own batch: a check that could not pass by accident
    assert fault_free_losses(WorkloadSpec(), seed=8, world=4, steps=12)[0] != reference[0]
    # two summation orders agree to 5 decimals early on: the spread starts at 0
    assert order_spread(reference, fault_free_losses(WorkloadSpec(), seed=7, world=4, steps=12, descending=True))[:4] \
        == [0.0] * 4
