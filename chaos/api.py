"""Interfaces of the fault library, without implementations (see `chaos.inject`).

A `Host` is where a fault lands: a rank's network host (its link to the switch) and the
process running on it. An `Injector` applies a fault value to hosts and returns an
`Injection`, whose `revert()` is idempotent and undoes the side effects last-in-first-out.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

from chaos.faults import FaultBase


@dataclass(frozen=True)
class Host:
    """One host of a cluster, as the fault library needs to see it. Its network side
    (`switch_ns`, `port`, `ns_path`) is None on a host without a network of its own (the
    local backend's ranks share the machine's loopback): link faults cannot act there."""

    name: str                 # "r005": unique within the run
    address: str              # the host's IP on the cluster network
    switch_ns: str | None     # namespace holding the bridge and this host's port
    port: str | None          # switch-side end of the host's link (a bridge port)
    ns_path: str | None       # the host's own network namespace (/run/netns/X or /proc/PID/ns/net)
    ifname: str = "eth0"      # the host-side end of the link
    pid: int | None = None    # the process on the host (a rank), for process faults
    storage: str | None = None  # the rank's checkpoint directory, for storage faults
    gpu: int | None = None  # the rank's GPU (this machine's index), for a GPU's settings
    # the processes of its agent a process fault acts on (`processes: workers` or
    # `monitors`), each (pid, start time), found by the harness that knows how it started them
    agent_processes: tuple[tuple[int, int], ...] = ()

    @property
    def has_link(self) -> bool:
        return self.switch_ns is not None and self.port is not None and self.ns_path is not None


@dataclass(frozen=True)
class AppliedFault:
    """What an apply did: when the kernel acknowledged it, on which hosts, which mechanism."""

    fault: FaultBase
    hosts: tuple[str, ...]
    mechanism: str
    t_applied: float                  # the kernel acknowledged the last action (fault start)
    t_requested: float | None = None  # just before the first action (a signal may act before
                                      # this process reads the clock again)


class Injection(abc.ABC):
    """Handle of one applied fault."""

    applied: AppliedFault

    @abc.abstractmethod
    def revert(self) -> float:
        """Undo the fault (idempotent); returns the kernel acknowledgement time of the undo."""


class Injector(abc.ABC):
    """Puts faults on hosts. Records every side effect in a ledger before making it."""

    @abc.abstractmethod
    def apply(self, fault: FaultBase, hosts: Sequence[Host],
              revert_after: float | None = None, heals_after: float | None = None) -> Injection:
        """Apply `fault` to every host in `hosts`; raises UnsupportedFault, FaultConflict or
        InjectionError. With `revert_after`, a fault with `dead_man` set is also reverted
        that many seconds later by a process that does not need this one alive.
        `heals_after` is when its on-phase ends (None: never while watched): an injector
        that cannot reach a host while its link is faulted (a Slurm node's agent) reverts
        it there at that time."""

    @abc.abstractmethod
    def mechanism(self, fault: FaultBase) -> str:
        """Which mechanism `apply` will use for `fault` on this machine (for plans and reports)."""
