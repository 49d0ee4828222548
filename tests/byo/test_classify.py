"""The output-line classifier (runfolder.classify) on lines recorded from real jobs.

tests/byo/recorded/*.log are the whole output of `torchrun --nproc-per-node 2` running
recorded/collective_script.py with torch 2.13 (CPU, gloo): `timeout` (rank 1 sleeps past a
3 s process-group timeout) and `exit` with --max-restarts 1 (rank 1 exits with code 3; the
agent restarts the group, whose re-formation times out connecting). The NCCL lines of
test_nccl_messages are PyTorch's messages as its source writes them, marked as such: a
NCCL group's failures need two GPUs. nccl_duplicate_gpu_h200.log and
cuda_device_assert_h200.log were recorded on the first GPU run (one H200, torch
2.11.0+cu130, NCCL 2.28.9; bench/gpu_nccl_one.py): the lines of two NCCL ranks put on one
GPU and of an out-of-range index on the GPU that name an error, NCCL or CUDA. gloo_peer_killed_netns.log is rank 0's log of
examples/train_ddp.py on 2 namespace hosts when rank 1 was killed (tests/byo/test_user_job_netns.py);
gloo_peer_reset_netns_16.log rank 6's of scenarios/byo_kill.yaml (16 hosts, rank 5 killed);
torchrun_restarts_exhausted_netns_16.log rank 0's agent and worker under byo_link_down.yaml's
torchrun_restarts variant (16 agents, --max-restarts 3, every restart failed).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from runfolder.classify import classify_line

RECORDED = Path(__file__).parent / "recorded"


def classified(name: str) -> list[tuple[str, str]]:
    lines = (RECORDED / name).read_text().splitlines()
    return [(cause, line) for line in lines if (cause := classify_line(line)) is not None]


def test_gloo_collective_timeout_recorded():
    found = classified("gloo_timeout_torchrun.log")
    timeouts = [line for cause, line in found if cause == "timeout"]
    assert len(timeouts) == 1 and "Timed out waiting 3000ms for recv operation" in timeouts[0]
    agent = [line for cause, line in found if cause == "agent"]
    assert any("failed (exitcode: 1) local_rank: 0" in line for line in agent)


def test_torchrun_restart_after_an_exit_recorded():
    counts = Counter(cause for cause, _ in classified("gloo_exit_torchrun_max_restarts_1.log"))
    # two worker failures reported by the agent, the final ChildFailedError (raised, printed)
    assert counts["agent"] == 4
    # both workers of the restarted group time out connecting to each other
    assert counts["timeout"] == 4
    assert set(counts) == {"agent", "timeout"}


def test_gloo_peer_killed_recorded():
    found = classified("gloo_peer_killed_netns.log")
    assert len(found) == 1 and found[0][0] == "closed"
    assert "Connection closed by peer [10.77.0.11]" in found[0][1]


def test_gloo_peer_reset_recorded():
    found = classified("gloo_peer_reset_netns_16.log")
    assert len(found) == 1 and found[0][0] == "reset"
    assert "Read error [10.77.0.15]" in found[0][1] and "Connection reset by peer" in found[0][1]


def test_torchrun_restarts_exhausted_recorded():
    found = classified("torchrun_restarts_exhausted_netns_16.log")
    causes = [cause for cause, _ in found]
    assert causes[0] == "timeout"  # the first worker's collective, while the link was down
    assert causes[-1] == "agent" and found[-1][1].endswith("RendezvousClosedError")
    assert sum("failed (exitcode: 1) local_rank: 0" in line for _, line in found) == 2
    assert "closed" in causes  # restarted groups failing to connect


def test_nccl_two_ranks_on_one_gpu_recorded():
    # recorded on the first GPU run (H200, torch 2.11.0+cu130, NCCL 2.28.9): bench/gpu_nccl_one.py
    found = classified("nccl_duplicate_gpu_h200.log")
    assert [cause for cause, _ in found] == ["nccl"] * 4
    assert "invalid usage" in found[1][1] and found[2][1].startswith("[rank0]: ncclInvalidUsage")


def test_cuda_device_assert_recorded():
    found = classified("cuda_device_assert_h200.log")
    assert found == [("cuda", "torch.AcceleratorError: CUDA error: device-side assert triggered")]


def test_ordinary_lines_are_not_errors():
    for line in ("step 12 loss 2.3012", "[rank0]: Traceback (most recent call last):", "[W1130 20:30:21.251050574 socket.cpp:207] [c10d] The hostname of "
                 "the client socket cannot be retrieved. err=-3", "rank 0: resumed from checkpoint.pt at step 10",
                 "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default", ""):
        assert classify_line(line) is None, line


@pytest.mark.parametrize("line, cause", [
    # as PyTorch's source writes them (ProcessGroupNCCL.cpp, NCCLUtils); not recorded here
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
     "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.",
     "watchdog"),
    ("[Rank 3] To avoid data inconsistency, we are taking the entire process down.", "watchdog"),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
     "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "nccl"),
    ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
     "nccl"),
])
def test_nccl_messages(line, cause):
    assert classify_line(line) == cause
