"""How the ranks of a newly formed generation agree on one state to go on from.

    checkpoint   the newest checkpoint of the lowest group rank that has one (group rank 0,
                 the saver, when it has any; none anywhere: the seeded initial weights),
                 loaded from each rank's own disk, or sent by that rank to every member
                 when one lacks it (disks local to each node): the steps since are run again
    peer         the newest in-memory state among the ranks (one may be a step ahead when a
                 collective failed half-way), sent by the lowest group rank that holds it:
                 nothing is run again

Each is a few collectives on the new group, run by every member, so a restore also proves
that the group works. The runner picks one by the policy's `restore` and writes what it
returns as the `restored` event.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from harness.job.checkpoint import Checkpointer
from harness.job.group import Group, Watch
from harness.job.workload import Workload


@dataclass(frozen=True)
class Restored:
    source: str                # checkpoint | peer
    peer: int | None = None    # peer: the original rank whose state was sent
    bytes: int | None = None   # peer: the size of that state

    def fields(self) -> dict[str, Any]:
        """The `restored` event's fields after step and gen."""
        if self.peer is None:
            return {"source": self.source}
        return {"source": self.source, "peer": self.peer, "bytes": self.bytes}


class RestoreStrategy(Protocol):
    def restore(self, group: Group, workload: Workload, watch: Watch | None) -> Restored:
        """Load the agreed state into `workload`; every member of `group` calls it."""
        ...


class FromCheckpoint:
    def __init__(self, checkpoints: Checkpointer) -> None:
        self.checkpoints = checkpoints

    def restore(self, group: Group, workload: Workload, watch: Watch | None) -> Restored:
        latest = self.checkpoints.latest()
        src = _lowest(group, latest is not None, watch)
        if src == group.world_size:  # no member has a checkpoint
            workload.reset()
            return Restored("checkpoint")
        agreed = torch.tensor([latest if group.rank == src else -1], dtype=torch.int64)
        group.all_reduce(agreed, "max", watch=watch)
        step = int(agreed.item())
        lacking = _lowest(group, step not in self.checkpoints.steps(), watch)
        if lacking == group.world_size:  # every member has it on its own disk
            workload.load_state(self.checkpoints.load(step))
            return Restored("checkpoint")
        state, size = _share(group, src, self.checkpoints.load(step) if group.rank == src else None, watch)
        workload.load_state(state)
        return Restored("checkpoint", peer=group.members[src], bytes=size)


class FromPeer:
    def restore(self, group: Group, workload: Workload, watch: Watch | None) -> Restored:
        # one all-reduce finds the newest step and the lowest group rank that holds it: the
        # greatest step * world_size + (world_size - 1 - rank)
        world = group.world_size
        key = torch.tensor([workload.step * world + world - 1 - group.rank], dtype=torch.int64)
        group.all_reduce(key, "max", watch=watch)
        src = world - 1 - int(key.item()) % world
        state, size = _share(group, src, workload.state() if group.rank == src else None, watch)
        if group.rank != src:
            workload.load_state(state)
        return Restored("peer", peer=group.members[src], bytes=size)


def _lowest(group: Group, holds: bool, watch: Watch | None) -> int:
    """The lowest group rank for which `holds` is true (world_size when none)."""
    source = torch.tensor([group.rank if holds else group.world_size], dtype=torch.int64)
    group.all_reduce(source, "min", watch=watch)
    return int(source.item())


def _share(group: Group, src: int, state: dict[str, Any] | None,
           watch: Watch | None) -> tuple[dict[str, Any], int]:
    """Group rank `src`'s `state` (the others pass None) on every member, and its size in bytes."""
    payload = b""
    if group.rank == src:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getvalue()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    group.all_reduce(size, "max", watch=watch)
    data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload
            else torch.empty(int(size.item()), dtype=torch.uint8))
    group.broadcast(data, src, watch=watch)
    if group.rank == src:
        return state, int(size.item())  # type: ignore[return-value]
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True), int(size.item())


def restore_strategy(source: Literal["checkpoint", "peer"], checkpoints: Checkpointer) -> RestoreStrategy:
    """The strategy a policy's `restore` names."""
    return FromPeer() if source == "peer" else FromCheckpoint(checkpoints)
