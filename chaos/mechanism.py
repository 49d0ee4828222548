"""What every fault mechanism is, and the undo table that revert, dead-man switch and heal run.

A mechanism writes a ledger entry *before* each side effect; the entry's `op` names an
undo in an `UndoTable` and its `args` carry all the undo needs, so a revert from the live
harness, the dead-man switch and `chaos heal` after a SIGKILL all run the same code. Undos
tolerate only "already gone". Tables are plain values that their owners define (the fault
library's is `chaos.undo.UNDOS`, a backend defines its own) and that are combined
explicitly, refusing an op defined twice; nothing is registered as a side effect of an import.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from chaos import proc
from chaos.api import Host
from chaos.errors import InjectionError, UnsupportedFault
from chaos.faults import FaultBase
from chaos.ledger import Entry, Ledger

if TYPE_CHECKING:
    from chaos.heal import HealReport

Undo = Callable[[dict[str, Any]], None]
# Finds leftovers only its owner knows how to see (docker's labelled containers), for a heal
# of one run (the id), of dead owners' runs, or of everything (the flag).
Sweep = Callable[[Optional[str], bool, "HealReport", Optional[Path]], object]


@dataclass(frozen=True)
class UndoTable:
    """How to take back what runs made: per ledger op the undo of an entry, and per name a
    sweep for what no ledger names."""

    ops: Mapping[str, Undo]
    sweeps: Mapping[str, Sweep] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", MappingProxyType(dict(self.ops)))
        object.__setattr__(self, "sweeps", MappingProxyType(dict(self.sweeps)))

    @staticmethod
    def combine(tables: Mapping[str, UndoTable]) -> UndoTable:
        """One table from tables named by their owners; an op or sweep two owners define is
        refused (one of them would silently lose)."""
        ops: dict[str, tuple[str, Undo]] = {}
        sweeps: dict[str, tuple[str, Sweep]] = {}
        for owner, table in tables.items():
            for what, merged, own in (("undo op", ops, table.ops), ("sweep", sweeps, table.sweeps)):
                for key, fn in own.items():
                    if key in merged:
                        raise ValueError(f"{what} {key!r} is defined by both {merged[key][0]} and {owner}")
                    merged[key] = (owner, fn)
        return UndoTable({k: fn for k, (_, fn) in ops.items()}, {k: fn for k, (_, fn) in sweeps.items()})

    def revert(self, entry: Entry, ledger: Ledger) -> None:
        """Undo one entry of `ledger` and mark it undone."""
        undo = self.ops.get(entry.op)
        if undo is None:
            raise InjectionError(
                f"{ledger.path}: no undo for {entry.op!r} in this table (a backend's op, and its "
                "table was not given); run `chaos heal`, which takes every backend's undos")
        undo(entry.args)
        ledger.mark(entry, "undone")


class Mechanism(abc.ABC):
    """How one fault kind is put on hosts on this machine."""

    name: str

    def conflict(self, fault: FaultBase, host: Host) -> str | None:
        """Why `fault` cannot join what `host`'s link already carries, or None. Checked on
        every target before anything is applied: faults compose or are refused, never
        silently override each other."""
        return None

    @abc.abstractmethod
    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        """Record the undo, then act; returns the entries to undo, in the order made."""

    def for_fault(self, fault: FaultBase) -> "Mechanism":
        """The mechanism that makes this very fault: this one, unless a setting of the fault
        asks for another way (`slow` with `stops`: the duty cycle, never the quota)."""
        return self


class ClusterMechanism(Mechanism):
    """A mechanism that needs the whole cluster (a partition acts between hosts)."""

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        return self.apply_cluster(fault, [host], (), ledger)

    @abc.abstractmethod
    def apply_cluster(self, fault: FaultBase, targets: Sequence[Host], cluster: Sequence[Host],
                      ledger: Ledger) -> list[Entry]:
        """Apply `fault` to `targets` within `cluster` (every host of the run)."""


class Unavailable(Mechanism):
    """A kind this machine cannot inject faithfully: refused with the reason, never weakened."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.name = f"unavailable: {reason}"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        raise UnsupportedFault(f"{fault.kind} cannot be injected here: {self.reason}")  # type: ignore[attr-defined]


def record_process(ledger: Ledger, pid: int, op: str = "sigkill") -> Entry:
    """Record a process the harness started so a revert or heal ends it (`op`: "sigkill",
    or "stop_process" for a helper that must finish its work on the way out)."""
    entry = ledger.record(op, pid=pid, started=proc.start_time(pid))
    ledger.mark(entry, "done")
    return entry
