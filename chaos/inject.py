"""Mechanisms that put each fault kind on a host, and the undo operations heal replays.

Every mechanism writes a ledger entry *before* acting; the entry's `op` names an undo in
`UNDO` and its `args` carry all that undo needs, so a revert from the live harness and a
`chaos heal` after a SIGKILL run the same code. Undos tolerate only "already gone".
"""
from __future__ import annotations

import abc
import os
import signal
import time
from typing import Any, Callable, Sequence

from chaos import netlink, proc
from chaos.api import AppliedFault, Host, Injection, Injector
from chaos.errors import UnsupportedFault
from chaos.faults import FaultBase, Kill, LinkDown, Pause
from chaos.ledger import Entry, Ledger

Undo = Callable[[dict[str, Any]], None]
UNDO: dict[str, Undo] = {}


def undo(op: str) -> Callable[[Undo], Undo]:
    def register(fn: Undo) -> Undo:
        UNDO[op] = fn
        return fn
    return register


@undo("owner")
def _undo_owner(args: dict[str, Any]) -> None:
    """The entry naming the process that owns a run; nothing to undo."""


@undo("netns")
def _undo_netns(args: dict[str, Any]) -> None:
    netlink.remove_namespace(args["name"])


@undo("link_up")
def _undo_link_down(args: dict[str, Any]) -> None:
    netlink.set_link_state(args["ns"], args["ifname"], up=True, gone_ok=True)


@undo("sigcont")
def _undo_pause(args: dict[str, Any]) -> None:
    proc.send_signal(args["pid"], signal.SIGCONT, args["started"], gone_ok=True)


@undo("sigkill")
def _undo_process(args: dict[str, Any]) -> None:
    """A process the harness started (rank, launcher, control plane, delayer)."""
    proc.send_signal(args["pid"], signal.SIGKILL, args["started"], gone_ok=True)


class Mechanism(abc.ABC):
    """How one fault kind is put on one host on this machine."""

    name: str

    @abc.abstractmethod
    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        """Record the undo, then act; returns the entries to undo, in the order made."""


class LinkStateDown(Mechanism):
    name = "link state down (switch-side port)"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        entry = ledger.record("link_up", ns=host.switch_ns, ifname=host.port)
        netlink.set_link_state(host.switch_ns, host.port, up=False)
        ledger.mark(entry, "done")
        return [entry]


def _require_pid(fault: FaultBase, host: Host) -> int:
    if host.pid is None:
        raise UnsupportedFault(f"{fault.kind} on {host.name}: the host has no process to signal")
    return host.pid


class SignalKill(Mechanism):
    name = "signal to the rank process"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Kill)
        pid = _require_pid(fault, host)
        proc.send_signal(pid, fault.signal, proc.start_time(pid))
        return []  # a kill has nothing to undo


class SignalStop(Mechanism):
    name = "SIGSTOP / SIGCONT of the rank process"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        pid = _require_pid(fault, host)
        started = proc.start_time(pid)
        entry = ledger.record("sigcont", pid=pid, started=started)
        proc.send_signal(pid, signal.SIGSTOP, started)
        ledger.mark(entry, "done")
        return [entry]


def default_mechanisms() -> dict[str, Mechanism]:
    return {"link_down": LinkStateDown(), "kill": SignalKill(), "pause": SignalStop()}


class LedgerInjection(Injection):
    def __init__(self, applied: AppliedFault, entries: list[Entry], ledger: Ledger) -> None:
        self.applied = applied
        self._pending = list(entries)
        self._ledger = ledger
        self._t_reverted: float | None = None

    def revert(self) -> float:
        while self._pending:
            entry = self._pending.pop()  # last in, first out
            UNDO[entry.op](entry.args)
            self._ledger.mark(entry, "undone")
        if self._t_reverted is None:
            self._t_reverted = time.monotonic()
        return self._t_reverted


class NetlinkInjector(Injector):
    """The injector for hosts reachable by netlink from this process (namespaces, containers)."""

    def __init__(self, ledger: Ledger, mechanisms: dict[str, Mechanism] | None = None) -> None:
        self.ledger = ledger
        self.mechanisms = mechanisms or default_mechanisms()

    def mechanism(self, fault: FaultBase) -> str:
        return self._mechanism(fault).name

    def _mechanism(self, fault: FaultBase) -> Mechanism:
        try:
            return self.mechanisms[fault.kind]  # type: ignore[attr-defined]
        except KeyError:
            raise UnsupportedFault(f"no mechanism for {fault.kind!r} on this machine") from None  # type: ignore[attr-defined]

    def apply(self, fault: FaultBase, hosts: Sequence[Host]) -> Injection:
        mech = self._mechanism(fault)
        entries: list[Entry] = []
        try:
            for host in hosts:
                entries += mech.apply(fault, host, self.ledger)
        except BaseException:
            LedgerInjection(AppliedFault(fault, (), mech.name, 0.0), entries, self.ledger).revert()
            raise
        applied = AppliedFault(fault, tuple(h.name for h in hosts), mech.name, time.monotonic())
        return LedgerInjection(applied, entries, self.ledger)


def undo_outstanding(ledger: Ledger) -> list[Entry]:
    """Undo every entry of `ledger` not yet undone, last in first out; returns them."""
    done = []
    for entry in ledger.outstanding():
        UNDO[entry.op](entry.args)
        ledger.mark(entry, "undone")
        done.append(entry)
    return done


def record_process(ledger: Ledger, pid: int) -> Entry:
    """Record a process the harness started so a heal can kill it."""
    entry = ledger.record("sigkill", pid=pid, started=proc.start_time(pid))
    ledger.mark(entry, "done")
    return entry


def record_owner(ledger: Ledger) -> None:
    """Name the live process that owns the run: heal leaves a run alone while it lives."""
    pid = os.getpid()
    ledger.mark(ledger.record("owner", pid=pid, started=proc.start_time(pid)), "done")
