"""Restore strategies against a fake group whose ranks are threads: its collectives reduce
what every rank put in, so the agreement between ranks is tested, not assumed."""
from __future__ import annotations

import errno
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from harness.job.checkpoint import Checkpointer
from harness.job.restore import FromCheckpoint, FromPeer, NoReadableCheckpoint, Restored, RestoreStrategy
from harness.job.workload import Workload, WorkloadSpec

SPEC = WorkloadSpec(hidden=8, features=4)


class Exchange:
    """Hands every rank what all ranks put in, once all have put theirs."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=10)
        self.slots: list[torch.Tensor | None] = [None] * world

    def __call__(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = tensor.clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody puts the next value in before all have read this one
        return got


class ThreadRank:
    """One member of a generation whose members are threads of this process."""

    def __init__(self, exchange: Exchange, rank: int, members: tuple[int, ...]) -> None:
        self.exchange = exchange
        self.rank = rank
        self.members = members
        self.member = members[rank]
        self.world_size = len(members)
        self.generation = 1

    def all_reduce(self, tensor, op="sum", watch=None):
        stacked = torch.stack(self.exchange(self.rank, tensor))
        reduced = {"sum": stacked.sum(0), "min": stacked.min(0).values, "max": stacked.max(0).values}
        tensor.copy_(reduced[op])

    def broadcast(self, tensor, src, watch=None):
        tensor.copy_(self.exchange(self.rank, tensor)[src])


def restore_all(strategies: list[RestoreStrategy], workloads: list[Workload],
                members: tuple[int, ...]) -> list[Restored]:
    exchange = Exchange(len(workloads))
    with ThreadPoolExecutor(len(workloads)) as pool:
        done = [pool.submit(s.restore, ThreadRank(exchange, r, members), w, None)
                for r, (s, w) in enumerate(zip(strategies, workloads, strict=True))]
        return [d.result(timeout=30) for d in done]


def trained(rank: int, steps: int) -> Workload:
    workload = Workload(SPEC, seed=3, rank=rank)
    for _ in range(steps):
        workload.train_step(lambda flat: None, 1)  # local gradients only: ranks drift apart
    return workload


def weights(workload: Workload) -> list[torch.Tensor]:
    return [p.detach().clone() for p in workload.model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_peer_restore_takes_the_newest_state_from_the_lowest_rank_that_holds_it():
    workloads = [trained(0, 5), trained(2, 6), trained(3, 6)]  # group ranks 1 and 2 are a step ahead
    sent = weights(workloads[1])
    assert not same(sent, weights(workloads[2]))
    restored = restore_all([FromPeer()] * 3, workloads, members=(0, 2, 3))
    assert {r.source for r in restored} == {"peer"}
    assert {r.peer for r in restored} == {2}  # original rank 2 = group rank 1, the lowest holding step 6
    assert len({r.bytes for r in restored}) == 1 and restored[0].bytes > 0
    assert [w.step for w in workloads] == [6, 6, 6]
    assert all(same(weights(w), sent) for w in workloads)
    assert all(torch.equal(v, s) for w in workloads for v, s in zip(w.velocity, workloads[1].velocity, strict=True))
    assert restored[0].fields() == {"source": "peer", "peer": 2, "bytes": restored[0].bytes}


@pytest.mark.parametrize(("steps", "source"), [((7, 5, 7, 3), 0), ((2, 2, 2, 2), 0), ((1, 4, 3, 4), 1),
                                              ((0, 0, 0, 9), 3)])
def test_peer_restore_picks_the_lowest_of_the_newest_whatever_the_spread(steps, source):
    members = (1, 4, 6, 9)
    workloads = [trained(member, step) for member, step in zip(members, steps, strict=True)]
    restored = restore_all([FromPeer()] * 4, workloads, members=members)
    assert {r.peer for r in restored} == {members[source]}
    assert [w.step for w in workloads] == [max(steps)] * 4


def test_checkpoint_restore_loads_the_newest_checkpoint_every_rank_has(tmp_path: Path):
    strategies, workloads = [], []
    for rank, newest in enumerate([4, 6, 4]):
        checkpoints = Checkpointer(tmp_path / f"r{rank}")
        workload = trained(rank, 0)
        for step in range(1, newest + 1):
            workload.train_step(lambda flat: None, 1)
            if step % 2 == 0:
                checkpoints.save(step, workload.state())
        strategies.append(FromCheckpoint(checkpoints))
        workloads.append(workload)
    restored = restore_all(strategies, workloads, members=(0, 1, 2))
    assert [r.fields() for r in restored] == [{"source": "checkpoint"}] * 3
    assert [w.step for w in workloads] == [4, 4, 4]  # rank 1's step 6 is not everyone's
    for rank, workload in enumerate(workloads):
        at_4 = trained(rank, 0)
        at_4.load_state(strategies[rank].checkpoints.load(4))
        assert same(weights(workload), weights(at_4))
        assert not same(weights(at_4), weights(trained(rank, 0)))  # step 4 is not the initial state


class FailingReads(Checkpointer):
    """A checkpoint folder whose disk fails the reads of some steps' files with EIO."""

    def __init__(self, directory: Path, failing: set[int]) -> None:
        super().__init__(directory)
        self.failing = failing

    def read(self, step: int) -> bytes:
        if step in self.failing:
            raise OSError(errno.EIO, "Input/output error", str(self.path(step)))
        return super().read(step)


def saved(folder: Path, steps: int, every: int = 2) -> Workload:
    """A rank trained `steps` steps that saved every `every` into `folder`."""
    workload, checkpoints = trained(0, 0), Checkpointer(folder)
    for step in range(1, steps + 1):
        workload.train_step(lambda flat: None, 1)
        if step % every == 0:
            checkpoints.save(step, workload.state())
    return workload


def test_checkpoint_restore_falls_back_past_a_newest_checkpoint_nobody_can_read(tmp_path: Path):
    saved(tmp_path, 6)  # steps 2, 4, 6 in one folder every rank reads (the netns backend's)
    strategies = [FromCheckpoint(FailingReads(tmp_path, {6})) for _ in range(3)]
    workloads = [trained(rank, 1) for rank in range(3)]
    restored = restore_all(strategies, workloads, members=(0, 1, 2))
    assert [w.step for w in workloads] == [4, 4, 4]
    at_4 = trained(0, 0)
    at_4.load_state(Checkpointer(tmp_path).load(4))
    assert all(same(weights(w), weights(at_4)) for w in workloads)
    assert list(restored[0].fields()["unreadable"]) == ["6"]  # the source rank names what it skipped
    assert "Input/output error" in restored[0].unreadable[6]


def test_checkpoint_restore_sends_the_newest_to_a_rank_whose_disk_cannot_read_it(tmp_path: Path):
    for rank in range(3):
        saved(tmp_path / f"r{rank}", 6)
    strategies = [FromCheckpoint(FailingReads(tmp_path / f"r{rank}", {6} if rank == 2 else set()))
                  for rank in range(3)]
    workloads = [trained(rank, 1) for rank in range(3)]
    restored = restore_all(strategies, workloads, members=(0, 1, 2))
    assert [w.step for w in workloads] == [6, 6, 6]
    assert {(r.peer, r.unreadable == {}) for r in restored} == {(0, True)}  # rank 0 sent step 6


def test_checkpoint_restore_fails_on_every_rank_when_no_checkpoint_can_be_read(tmp_path: Path):
    saved(tmp_path, 4)
    strategies = [FromCheckpoint(FailingReads(tmp_path, {2, 4})) for _ in range(2)]
    workloads = [trained(rank, 1) for rank in range(2)]
    with pytest.raises(NoReadableCheckpoint, match=r"rank 0 \(step 4: OSError: .*; step 2: OSError"):
        restore_all(strategies, workloads, members=(0, 1))
    assert [w.step for w in workloads] == [1, 1]  # neither went on from the initial weights


def test_checkpoint_restore_skips_a_torn_newest_checkpoint_and_says_it_was_torn(tmp_path: Path):
    saved(tmp_path, 6)
    newest = Checkpointer(tmp_path).path(6)
    newest.write_bytes(newest.read_bytes()[:1000])  # what a crash leaves of a save never fsynced
    strategies = [FromCheckpoint(Checkpointer(tmp_path)) for _ in range(2)]
    workloads = [trained(rank, 1) for rank in range(2)]
    restored = restore_all(strategies, workloads, members=(0, 1))
    assert [w.step for w in workloads] == [4, 4]
    assert list(restored[0].fields()["torn"]) == ["6"] and restored[0].unreadable == {}


def test_a_checkpointer_that_does_not_skip_torn_files_fails_every_rank_on_its_newest(tmp_path: Path):
    """The planted restore_while_saving's restore (harness.job.planted): it trusts the
    newest file, so every member fails loading the torn one, as a naive job's would."""
    saved(tmp_path, 6)
    newest = Checkpointer(tmp_path).path(6)
    newest.write_bytes(newest.read_bytes()[:1000])
    trusting = type("Trusting", (Checkpointer,), {"skips_torn": False})
    exchange = Exchange(2)
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(FromCheckpoint(trusting(tmp_path)).restore, ThreadRank(exchange, r, (0, 1)),
                            trained(r, 1), None) for r in range(2)]
        errors = [d.exception(timeout=30) for d in done]
    assert all(isinstance(e, RuntimeError) and "zip" in str(e) for e in errors), errors
