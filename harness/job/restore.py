"""How the ranks of a newly formed generation agree on one state to go on from.

    checkpoint   the newest checkpoint of the lowest group rank that has one (group rank 0,
                 the saver, when it has any; none anywhere: the seeded initial weights)
                 that it can read: one its disk fails to read (EIO: `unreadable`) or whose
                 bytes are no checkpoint (`torn`) is skipped for the next older, named in
                 the `restored` event (reports.state judges a torn one that was saved
                 durably as a lost save); none readable
                 fails the restore on every member (`NoReadableCheckpoint`), never a
                 silent start from scratch. Loaded from each rank's own disk, or sent by
                 that rank to every member when one lacks it or cannot read it (disks
                 local to each node): the steps since are run again
    peer         the newest in-memory state among the ranks (one may be a step ahead when a
                 collective failed half-way), sent by the lowest group rank that holds it:
                 nothing is run again

Each is a few collectives on the new group, run by every member, so a restore also proves
that the group works. The runner picks one by the policy's `restore` and writes what it
returns as the `restored` event.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
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
    # checkpoint: the newer checkpoints this rank skipped (step -> the error): its disk
    # failed the read (an OSError), or what it read is no checkpoint (torn)
    unreadable: dict[int, str] = field(default_factory=dict)
    torn: dict[int, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The `restored` event's fields after step and gen."""
        skipped = _skipped_fields(self.unreadable, self.torn)
        if self.peer is None:
            return {"source": self.source, **skipped}
        return {"source": self.source, "peer": self.peer, "bytes": self.bytes, **skipped}


class NoReadableCheckpoint(RuntimeError):
    """Checkpoints exist but the rank that holds them could read none: the restore fails
    rather than go on from the initial weights (steps would be lost without a word)."""

    def __init__(self, src: int, unreadable: dict[int, str], torn: dict[int, str]) -> None:
        self.unreadable, self.torn = unreadable, torn  # empty on every rank but `src`
        skipped = sorted({**unreadable, **torn}.items(), reverse=True)
        detail = "; ".join(f"step {step}: {error}" for step, error in skipped)
        super().__init__(f"no readable checkpoint on rank {src}" + (f" ({detail})" if detail else ""))

    def fields(self) -> dict[str, Any]:
        """The `restore_failed` event's fields after gen."""
        return _skipped_fields(self.unreadable, self.torn)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def _skipped_fields(unreadable: dict[int, str], torn: dict[int, str]) -> dict[str, dict[str, str]]:
    """The checkpoints a restore passed over, as an event's fields (JSON keys are strings)."""
    return {name: {str(k): v for k, v in found.items()}
            for name, found in (("unreadable", unreadable), ("torn", torn)) if found}


class RestoreStrategy(Protocol):
    def restore(self, group: Group, workload: Workload, watch: Watch | None) -> Restored:
        """Load the agreed state into `workload`; every member of `group` calls it."""
        ...


class FromCheckpoint:
    def __init__(self, checkpoints: Checkpointer) -> None:
        self.checkpoints = checkpoints

    def restore(self, group: Group, workload: Workload, watch: Watch | None) -> Restored:
        steps = self.checkpoints.steps()
        src = _lowest(group, bool(steps), watch)
        if src == group.world_size:  # no member has a checkpoint
            workload.reset()
            return Restored("checkpoint")
        state: dict[str, Any] | None = None
        unreadable: dict[int, str] = {}
        torn: dict[int, str] = {}
        newest = -1
        if group.rank == src:
            newest, state = self._newest_readable(steps, unreadable, torn)
        agreed = torch.tensor([newest], dtype=torch.int64)
        group.all_reduce(agreed, "max", watch=watch)
        step = int(agreed.item())
        if step < 0:
            raise NoReadableCheckpoint(group.members[src], unreadable, torn)
        if state is None and step in steps:
            state = self._read(step)
        lacking = _lowest(group, state is None, watch)
        if lacking == group.world_size:  # every member read it from its own disk
            assert state is not None
            workload.load_state(state)
            return Restored("checkpoint", unreadable=unreadable, torn=torn)
        state, size = _share(group, src, state if group.rank == src else None, watch)
        workload.load_state(state)
        return Restored("checkpoint", peer=group.members[src], bytes=size, unreadable=unreadable, torn=torn)

    def _newest_readable(self, steps: list[int], unreadable: dict[int, str],
                         torn: dict[int, str]) -> tuple[int, dict[str, Any] | None]:
        """The newest of `steps` this rank can load (-1 when none) and its state; the newer
        ones that failed go into `unreadable` or `torn` with their errors."""
        for step in reversed(steps):
            try:
                data = self.checkpoints.read(step)
            except OSError as exc:
                unreadable[step] = _error(exc)
                continue
            try:
                return step, self.checkpoints.parse(data)
            except Exception as exc:  # whatever the parser raises: the bytes are no checkpoint
                if not self.checkpoints.skips_torn:  # loaded again once agreed: fails on every member
                    return step, None
                torn[step] = _error(exc)
        return -1, None

    def _read(self, step: int) -> dict[str, Any] | None:
        """Checkpoint `step` from this rank's disk; None when it cannot be read (the
        source rank sends it instead)."""
        try:
            data = self.checkpoints.read(step)
        except OSError:
            return None
        try:
            return self.checkpoints.parse(data)
        except Exception:
            if not self.checkpoints.skips_torn:
                raise
            return None


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
