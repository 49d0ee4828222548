"""Interfaces of the harness, without implementations.

Spec / instance / result are separate types (as in TorchElastic): a `ClusterSpec` says
what to build, a `Backend` builds it and returns a `Cluster` (the live instance: hosts,
control-plane address, rank processes), and a `RankExit` is what a rank left when it
ended. What a backend can do is declared by the backend (`Traits`); the registry of their
names is `harness.cluster.backends`, the value types are `harness.cluster.spec`. `harness.cluster.netns` is the default backend (one
Linux network namespace per rank); others (docker, local) implement the same interface.
"""
from __future__ import annotations

import abc
import os
from typing import TYPE_CHECKING, ClassVar

from chaos import linkstats, userns
from chaos.api import Host, Injector
from chaos.errors import HarnessError
from chaos.ledger import Ledger
from chaos.mechanism import Mechanism
from harness.cluster.spec import JOB_MASTER_PORT, ClusterSpec, RankExit, Traits

if TYPE_CHECKING:
    from harness.cluster.launcher import LauncherPool

class Cluster(abc.ABC):
    """A live cluster: N hosts, a control plane on the switch, and rank processes."""

    spec: ClusterSpec
    hosts: tuple[Host, ...]  # index = rank
    store_address: str       # the control plane (rendezvous store), reachable from every host
    store_port: int
    job_port: int = JOB_MASTER_PORT  # a user job's MASTER_PORT on rank 0's host
    restarts: int = 0  # how often a scheduler started the job again (requeue_state)
    timings: dict[str, float]  # seconds per phase of its bring-up (hosts, launcher, control, ...), where measured

    @abc.abstractmethod
    def start_rank(self, rank: int, config: dict) -> int:
        """Start (or restart) the process of `rank` with the rank config; returns its pid."""

    def start_job(self, rank: int, launch: dict) -> int:
        """Start `rank`'s process of the user's own job (harness.cluster.userjob.launch_command:
        argv, cwd, env, step pattern) on its host; returns its pid."""
        raise HarnessError(f"the {self.spec.run_id} cluster's backend cannot run your own job yet; "
                           "use cluster.backend: netns")

    @abc.abstractmethod
    def pid(self, rank: int) -> int | None:
        """The current process of `rank`, if it is alive."""

    @abc.abstractmethod
    def reap(self) -> list[RankExit]:
        """Rank processes that ended since the last call (non-blocking)."""

    @abc.abstractmethod
    def stop_ranks(self, deadline_s: float) -> list[RankExit]:
        """SIGTERM every live rank, SIGKILL what is left at the deadline; returns their exits."""

    @abc.abstractmethod
    def close(self) -> None:
        """Remove everything the cluster made (idempotent; also after a failed bring-up)."""

    def link_bytes(self) -> tuple[int, ...]:
        """Bytes each rank's link has carried so far (both ways), by rank."""
        return linkstats.link_bytes(self.hosts)

    def backlog_drops(self) -> int | None:
        """Packets the hosts' kernel has dropped so far with a CPU's receive backlog full
        (the whole machine's count); None where the cluster has no such kernel."""
        return linkstats.backlog_drops()

    def injector(self, ledger: Ledger, mechanisms: dict[str, Mechanism]) -> Injector:
        """What a trial puts faults on these hosts with: netlink from this process with
        `mechanisms` (the probe's, this cluster's own over them), every backend's undos."""
        from chaos.inject import NetlinkInjector
        from harness.cluster.undos import undo_table
        return NetlinkInjector(ledger, mechanisms, hosts=self.hosts, undos=undo_table())

    def requeue_state(self) -> str | None:
        """Once every rank has ended, whether a scheduler starts the job again (a requeue, a
        preemption with requeue, a node failure): None, the job is over (and always where
        there is no scheduler); "pending", it is to start again; "ready", it runs again and
        its hosts take ranks. Asked at every turn of the trial's loop until not "pending"."""
        return None

    def not_here(self, rank: int) -> str | None:
        """Why this machine cannot read or signal `rank`'s processes by pid (they run under
        another kernel, where that pid names another process); None: it can."""
        return None

    def refuses(self, kind: str, rank: int) -> str | None:
        """Why the host of `rank` cannot take a fault of `kind`, learnt once the hosts are up
        (a scheduler's node whose agent lacks a capability); None: it can. Asked of every
        planned fault before a rank starts."""
        return None

    def mechanisms(self) -> dict[str, Mechanism]:
        """Fault mechanisms this backend does its own way (e.g. kill through the engine),
        by fault kind; they replace the defaults of `chaos.inject` for its hosts."""
        return {}


class Backend(abc.ABC):
    """Builds clusters of one kind (network namespaces, containers)."""

    name: str
    traits: ClassVar[Traits]
    start_timeout_s: float = 60.0

    @classmethod
    def why_not_here(cls) -> str | None:
        """Why this backend cannot run on this machine for this user, or None."""
        if not cls.traits.needs_root or (os.geteuid() == 0 and not userns.entered()):
            return None
        if not cls.traits.user_namespace:
            return "needs root"
        why = None if userns.entered() else userns.why_not()
        return None if why is None else f"needs root, or a user namespace: {why}"  # from bring-up until every rank steps (warm-up steps' own time on top)

    @classmethod
    def planned_mechanism(cls, fault: object) -> str | None:
        """How this backend puts `fault` on, for a dry run's plan, where it does so its own
        way (None: the machine's mechanism for the kind, from the probe)."""
        return None

    @abc.abstractmethod
    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> Cluster:
        """Build the hosts and the control plane; every side effect goes to `ledger` first.
        The processes on the hosts are forked by a launcher taken from `launchers`, given
        back when the cluster closes."""
