"""How the ranks of a newly formed generation agree on one state to go on from.

    checkpoint   the newest checkpoint every rank can see (MIN over the ranks; none: the
                 seeded initial weights): the steps since are run again
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
        agreed = torch.tensor([-1 if latest is None else latest], dtype=torch.int64)
        group.all_reduce(agreed, "min", watch=watch)
        step = int(agreed.item())
        if step < 0:
            workload.reset()
        else:
            workload.load_state(self.checkpoints.load(step))
        return Restored("checkpoint")


class FromPeer:
    def restore(self, group: Group, workload: Workload, watch: Watch | None) -> Restored:
        newest = torch.tensor([workload.step], dtype=torch.int64)
        group.all_reduce(newest, "max", watch=watch)
        holds = workload.step == int(newest.item())
        source = torch.tensor([group.rank if holds else group.world_size], dtype=torch.int64)
        group.all_reduce(source, "min", watch=watch)
        src = int(source.item())
        payload = b""
        if group.rank == src:
            buffer = io.BytesIO()
            torch.save(workload.state(), buffer)
            payload = buffer.getvalue()
        size = torch.tensor([len(payload)], dtype=torch.int64)
        group.all_reduce(size, "max", watch=watch)
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload
                else torch.empty(int(size.item()), dtype=torch.uint8))
        group.broadcast(data, src, watch=watch)
        if group.rank != src:
            workload.load_state(torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True))
        return Restored("peer", peer=group.members[src], bytes=int(size.item()))


def restore_strategy(source: Literal["checkpoint", "peer"], checkpoints: Checkpointer) -> RestoreStrategy:
    """The strategy a policy's `restore` names."""
    return FromPeer() if source == "peer" else FromCheckpoint(checkpoints)
