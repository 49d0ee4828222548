"""What every fault mechanism is. Each writes a ledger entry *before* each side effect,
whose `op` names an undo in its module's `UndoTable` (chaos.undotable)."""
from __future__ import annotations

import abc
from typing import Sequence

from chaos import proc
from chaos.api import Host
from chaos.errors import UnsupportedFault
from chaos.faults import FaultBase
from chaos.ledger import Entry, Ledger


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
