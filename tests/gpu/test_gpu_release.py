"""GPU memory released after a breaker opens (harness.trial.gpumem), with NVML's answers given
as values, and the report's figure judged against 512 MB within 50 s; on a GPU, NVML's own
answer for this process (requires_gpu)."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from harness.job.device import gpu_memory_by_pid
from harness.job.runner import free_accelerator_memory
from harness.trial.gpumem import RELEASE_BAR_BYTES, GpuRelease
from reports.metrics import _gpu_release_columns

GB = 2**30


def answers(*held: dict[int, int] | None):
    queue = list(held)
    asked = []

    def held_by_pid() -> dict[int, int] | None:
        asked.append(1)
        return queue.pop(0)
    return held_by_pid, asked


def test_a_rank_is_released_once_its_process_holds_at_most_the_bar() -> None:
    held_by_pid, _ = answers({100: 2 * GB}, {100: GB}, {100: RELEASE_BAR_BYTES})
    release = GpuRelease(held_by_pid)
    pids = {3: 100}.get
    assert release.poll({3: 10.0}, pids) == []
    assert release.poll({3: 10.0}, pids) == []
    assert release.poll({3: 10.0}, pids) == [(3, 10.0, RELEASE_BAR_BYTES)]
    assert release.poll({3: 10.0}, pids) == []  # once per rank


def test_a_rank_whose_process_is_gone_holds_nothing() -> None:
    held_by_pid, _ = answers({})
    assert GpuRelease(held_by_pid).poll({5: 1.0}, lambda rank: None) == [(5, 1.0, 0)]


def test_without_nvml_nothing_is_observed_and_nvml_is_not_asked_again() -> None:
    held_by_pid, asked = answers(None)
    release = GpuRelease(held_by_pid)
    assert release.poll({3: 10.0}, {3: 100}.get) == [] and release.poll({3: 10.0}, {3: 100}.get) == []
    assert len(asked) == 1


def test_nvml_is_not_asked_before_a_breaker_opens() -> None:
    held_by_pid, asked = answers()
    assert GpuRelease(held_by_pid).poll({}, lambda rank: 1) == [] and asked == []


def test_the_report_takes_the_slowest_rank_and_judges_it_against_50_s() -> None:
    def frame(*secs: float) -> pd.DataFrame:
        return pd.DataFrame([{"kind": "gpu_memory_released", "t": 100.0 + s, "breaker_t": 100.0, "rank": r}
                             for r, s in enumerate(secs)] + [{"kind": "step", "t": 99.0, "rank": 0}])
    assert _gpu_release_columns(frame(2.0, 7.5)) == {"gpu_released_s": 7.5, "gpu_release_within_bar": True}
    assert _gpu_release_columns(frame(51.0))["gpu_release_within_bar"] is False
    none = _gpu_release_columns(frame())
    assert math.isnan(none["gpu_released_s"]) and none["gpu_release_within_bar"] is pd.NA  # not observed


@pytest.mark.requires_gpu
def test_nvml_sees_what_this_process_holds_and_that_the_release_gives_it_back() -> None:
    import os
    block = torch.empty(GB, dtype=torch.uint8, device="cuda")
    assert gpu_memory_by_pid()[os.getpid()] >= GB
    del block
    free_accelerator_memory()  # cuBLAS's workspaces too, which earlier tests' matmuls took
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < 2 << 20  # live tensors' segments only


def test_an_exit_by_sigabrt_is_a_crash_by_abort() -> None:
    import signal

    from reports.trial_facts import departures, is_crash
    events = pd.DataFrame([{"kind": "rank_start", "t": 1.0, "rank": 0},
                           {"kind": "rank_exited", "t": 9.0, "rank": 0, "signal": int(signal.SIGABRT), "exitcode": None}])
    gone = departures(events, (0,), (), observation_end=20.0)
    assert gone[0].how == "crashed-by-abort" and is_crash(gone[0])


@pytest.mark.parametrize(("message", "cause"), [
    ("NCCL error in: ProcessGroupNCCL.cpp:1935, remote process exited or there was a network error, NCCL "
     "version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote process "
     "exiting prematurely.", "remote"),
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE) ran for "
     "5000 milliseconds before timing out.", "timeout"),
])
def test_nccl_failures_are_detections_with_a_cause(message: str, cause: str) -> None:
    from harness.job.group import classify
    assert classify(message) == cause
