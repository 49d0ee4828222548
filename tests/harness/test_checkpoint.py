"""Atomic checkpoints: a writer SIGKILLed mid-write leaves the newest complete checkpoint
readable and a temp file the next save removes; with disks local to each node (only group
rank 0 saves), the ranks still agree on rank 0's checkpoint instead of starting over."""
from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from harness.job.checkpoint import TEMP_PREFIX, Checkpointer
from harness.job.restore import FromCheckpoint
from harness.job.workload import Workload
from tests.harness.test_restore import SPEC, restore_all, same, trained, weights

ROOT = Path(__file__).resolve().parents[2]
# Saves step 1, 2, ... of a state big enough (64 MB) that a write takes a while.
WRITER = textwrap.dedent("""
    import sys, torch
    from harness.job.checkpoint import Checkpointer
    checkpoints = Checkpointer(sys.argv[1], keep=2)
    state = {"weights": torch.zeros(16 * 1024 * 1024)}
    step = 0
    while True:
        step += 1
        state["weights"].fill_(step)
        checkpoints.save(step, state)
""")


def temp_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{TEMP_PREFIX}*"))


def kill_mid_write(directory: Path, deadline_s: float = 60.0) -> None:
    """Start the writer and SIGKILL it while a temp file exists after one complete save."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)], cwd=ROOT)
    try:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if Checkpointer(directory).latest() is not None and temp_files(directory):
                os.kill(writer.pid, signal.SIGKILL)
                break
            assert writer.poll() is None, "the writer died on its own"
            time.sleep(0.0005)
        else:
            pytest.fail(f"no write caught in progress within {deadline_s:g} s")
    finally:
        writer.kill()
        writer.wait(timeout=10)
    assert writer.returncode == -signal.SIGKILL


def test_a_writer_killed_mid_write_leaves_the_newest_complete_checkpoint_readable(tmp_path: Path):
    kill_mid_write(tmp_path)
    assert temp_files(tmp_path), "the kill left no half-written temp file: nothing was tested"
    checkpoints = Checkpointer(tmp_path)
    newest = checkpoints.latest()
    state = checkpoints.load(newest)
    assert torch.equal(state["weights"], torch.full((16 * 1024 * 1024,), float(newest)))
    checkpoints.save(newest + 1, {"weights": torch.zeros(1)})
    assert temp_files(tmp_path) == []  # the next save removed the dead writer's temp file


def test_a_save_whose_directory_fsync_fails_after_the_rename_leaves_the_older_checkpoint_newest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """EIO on the folder's fsync (chaos.fusefs fails fsyncdir with fsync), as a fault that
    came between the file's fsync and the folder's: the save is reported failed, and the
    renamed file must not be left for a restore to take as the newest checkpoint."""
    checkpoints = Checkpointer(tmp_path)
    checkpoints.save(10, {"weights": torch.zeros(1)})
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        checkpoints.save(15, {"weights": torch.ones(1)})
    assert (checkpoints.latest(), temp_files(tmp_path)) == (10, [])


def test_a_save_removes_stale_temp_files(tmp_path: Path):
    checkpoints = Checkpointer(tmp_path)
    stale = tmp_path / f"{TEMP_PREFIX}4242-step-00000003.pt"
    stale.write_bytes(b"half a checkpoint")
    checkpoints.save(4, {"x": torch.ones(1)})
    assert not stale.exists()
    assert checkpoints.steps() == [4]


def saved(directory: Path, rank: int, steps: int, every: int = 2) -> tuple[Checkpointer, Workload]:
    """A rank trained `steps` steps that saved every `every` steps into `directory`."""
    checkpoints, workload = Checkpointer(directory), trained(rank, 0)
    for step in range(1, steps + 1):
        workload.train_step(lambda flat: None, 1)
        if step % every == 0:
            checkpoints.save(step, workload.state())
    return checkpoints, workload


def test_node_local_disks_restore_rank_0s_checkpoint_on_every_rank(tmp_path: Path):
    # only group rank 0 saves; each rank's own disk: ranks 1 and 2 have no checkpoint at all
    saver, first = saved(tmp_path / "node0", 0, 6)
    at_6 = weights(first)
    workloads = [first, trained(1, 7), trained(2, 7)]
    strategies = [FromCheckpoint(saver), FromCheckpoint(Checkpointer(tmp_path / "node1")),
                  FromCheckpoint(Checkpointer(tmp_path / "node2"))]
    restored = restore_all(strategies, workloads, members=(0, 1, 2))
    assert [w.step for w in workloads] == [6, 6, 6]
    assert all(same(weights(w), at_6) for w in workloads)
    assert {r.source for r in restored} == {"checkpoint"} and {r.peer for r in restored} == {0}
    assert len({r.bytes for r in restored}) == 1 and restored[0].bytes > 0


def test_a_shared_disk_sends_nothing(tmp_path: Path):
    saver, first = saved(tmp_path / "shared", 0, 4)
    workloads = [first, trained(1, 5)]
    restored = restore_all([FromCheckpoint(saver), FromCheckpoint(Checkpointer(tmp_path / "shared"))],
                           workloads, members=(0, 1))
    assert [r.fields() for r in restored] == [{"source": "checkpoint"}] * 2
    assert [w.step for w in workloads] == [4, 4]
    assert same(weights(workloads[0]), weights(workloads[1]))


def test_the_lowest_rank_with_a_checkpoint_is_the_source_when_group_rank_0_has_none(tmp_path: Path):
    # after the saver left, the new group rank 0 (original rank 1) has nothing on its disk
    holder, second = saved(tmp_path / "node2", 2, 4)
    at_4 = weights(second)
    workloads = [trained(1, 5), second, trained(3, 5)]
    strategies = [FromCheckpoint(Checkpointer(tmp_path / "node1")), FromCheckpoint(holder),
                  FromCheckpoint(Checkpointer(tmp_path / "node3"))]
    restored = restore_all(strategies, workloads, members=(1, 2, 3))
    assert [w.step for w in workloads] == [4, 4, 4]
    assert all(same(weights(w), at_4) for w in workloads)
    assert {r.peer for r in restored} == {2}


def test_no_checkpoint_anywhere_starts_from_the_seeded_weights(tmp_path: Path):
    initial = weights(Workload(SPEC, seed=3, rank=0))
    workloads = [trained(0, 2), trained(1, 2)]
    restore_all([FromCheckpoint(Checkpointer(tmp_path / f"n{r}")) for r in range(2)], workloads, members=(0, 1))
    assert [w.step for w in workloads] == [0, 0]
    assert all(same(weights(w), initial) for w in workloads)
