"""A cluster without hosts or processes, for root-free tests of the orchestrator.

    clock = FakeClock()
    backend = FakeBackend(clock)
    Trial(plan, trial_dir, backend, progress, make_injector=backend.injector,
          clock=clock, sleep=clock.sleep, state_dir=tmp_path).run()
    backend.journal   # [("up", 4), ("start_rank", 0), ..., ("apply", "link_down", (1,)), ...]

Each rank is a row in a table that steps on the injected clock: whenever the harness looks
(pid, reap, stop), every live rank catches up, writing the events a real rank writes
(rank_start, group_ready, one step per workload `step_period`, exit when stopped) into the
trial's events file. `FakeInjector` acts on the table: while any fault but a kill is
applied every rank stalls (a ring all-reduce waits for its slowest member); a kill ends its
targets' processes (SIGKILL). Everything the harness asks of the cluster and the injector is
appended to the backend's `journal`, in order, so a test can check the teardown; each
apply's dead-man delay (`revert_after`) to the cluster's `dead_men`. A rank's link carries a
gradient's worth per step it makes (`link_bytes`).
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Sequence

from chaos.api import AppliedFault, Host, Injection, Injector
from chaos.faults import FaultBase
from chaos.undo import UNDOS, undo_outstanding
from chaos.ledger import Ledger
from harness.cluster.api import Backend, Cluster
from harness.cluster.spec import STORE_PORT, ClusterSpec, RankExit, Traits
from harness.cluster.launcher import LauncherPool
from harness.job.config import RankConfig
from runfolder import events as kinds
from runfolder.events import EventRecorder

MECHANISM = "fake"
FIRST_PID = 10_000


class FakeClock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeRank:
    rank: int
    pid: int
    period: float
    next_step_at: float
    recorder: EventRecorder
    gradient_bytes: int  # what each step moves through its link
    step: int = 0


class FakeCluster(Cluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger, clock: FakeClock, journal: list[tuple[Any, ...]],
                 refused: dict[tuple[str, int], str]) -> None:
        self.spec = spec
        self.refused = refused
        self.hosts = tuple(Host(name=f"r{r:03d}", address=f"10.99.0.{10 + r}", switch_ns="fake-switch",
                                port=f"fake-p{r}", ns_path=f"/fake/netns/r{r:03d}") for r in range(spec.ranks))
        self.store_address = "10.99.0.1"
        self.store_port = STORE_PORT
        self._ledger = ledger
        self.clock = clock
        self.journal = journal
        self.dead_men: list[float | None] = []  # `revert_after` of each apply, in order
        self.live: dict[int, FakeRank] = {}
        self.stalls = 0  # faults applied that stall the ring
        self.carried: dict[int, int] = {}  # bytes through each rank's link
        self._ended: list[RankExit] = []  # not reaped yet
        self._next_pid = FIRST_PID

    def refuses(self, kind: str, rank: int) -> str | None:
        return self.refused.get((kind, rank))

    def start_rank(self, rank: int, config: dict) -> int:
        cfg = RankConfig.model_validate(config)  # as the rank itself reads it
        self.journal.append(("start_rank", rank))
        now = self.clock()
        recorder = EventRecorder(cfg.events_path, kinds.RANK, rank, clock=self.clock)
        recorder.emit(kinds.RANK_START, policy=cfg.policy.name, world=cfg.world_size)
        recorder.emit(kinds.GROUP_READY, gen=0, world=cfg.world_size, group_rank=rank, secs=0.0)
        self._next_pid += 1
        self.live[rank] = FakeRank(rank, self._next_pid, cfg.workload.step_period,
                                   now + cfg.workload.step_period, recorder, cfg.workload.gradient_bytes)
        return self._next_pid

    def advance(self) -> None:
        """Every live rank makes the steps it would have made by now; a stalled ring waits,
        and steps again one period after the stall ends."""
        now = self.clock()
        for rank in self.live.values():
            if self.stalls:
                rank.next_step_at = max(rank.next_step_at, now + rank.period)
                continue
            while rank.next_step_at <= now:
                rank.recorder.emit(kinds.STEP, t=rank.next_step_at, step=rank.step, gen=0, loss=1.0, dur=rank.period)
                rank.step += 1
                rank.next_step_at += rank.period
                self.carried[rank.rank] = self.carried.get(rank.rank, 0) + rank.gradient_bytes

    def link_bytes(self) -> tuple[int, ...]:
        """A link carries a gradient's worth per step its rank makes (none once it exited)."""
        self.advance()
        return tuple(self.carried.get(r, 0) for r in range(self.spec.ranks))

    def backlog_drops(self) -> int | None:
        return None  # no kernel under these ranks

    def kill(self, rank: int) -> None:
        gone = self.live.pop(rank)
        gone.recorder.close()
        self._ended.append(RankExit(rank, gone.pid, None, signal.SIGKILL, self.clock()))

    def pid(self, rank: int) -> int | None:
        self.advance()
        return self.live[rank].pid if rank in self.live else None

    def reap(self) -> list[RankExit]:
        self.advance()
        ended, self._ended = self._ended, []
        return ended

    def stop_ranks(self, deadline_s: float) -> list[RankExit]:
        self.advance()
        self.journal.append(("stop_ranks", tuple(sorted(self.live))))
        exits = []
        for rank in list(self.live.values()):
            rank.recorder.emit(kinds.EXIT, reason="terminated", code=0)  # SIGTERM, as a real rank answers it
            rank.recorder.close()
            exits.append(RankExit(rank.rank, rank.pid, 0, None, self.clock()))
        self.live.clear()
        return exits

    def close(self) -> None:
        self.journal.append(("close",))
        undo_outstanding(self._ledger, UNDOS)  # the owner entry: this cluster made nothing else


class FakeInjection(Injection):
    def __init__(self, injector: FakeInjector, applied: AppliedFault) -> None:
        self.injector = injector
        self.applied = applied
        self.reverted_at: float | None = None

    def revert(self) -> float:
        if self.reverted_at is None:
            self.reverted_at = self.injector.revert(self)
        return self.reverted_at


class FakeInjector(Injector):
    """Stalls or kills the fake cluster's ranks; the journal names each fault by its kind and
    its target ranks."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def _ranks(self, names: Sequence[str]) -> tuple[int, ...]:
        by_name = {host.name: rank for rank, host in enumerate(self.cluster.hosts)}
        return tuple(by_name[name] for name in names)

    def apply(self, fault: FaultBase, hosts: Sequence[Host], revert_after: float | None = None,
              heals_after: float | None = None) -> Injection:
        cluster = self.cluster
        cluster.advance()  # the steps made before the fault
        names = tuple(host.name for host in hosts)
        cluster.journal.append(("apply", fault.kind, self._ranks(names)))  # type: ignore[attr-defined]
        cluster.dead_men.append(revert_after)
        if fault.kind == "kill":  # type: ignore[attr-defined]
            for rank in self._ranks(names):
                cluster.kill(rank)
        else:
            cluster.stalls += 1
        now = cluster.clock()
        return FakeInjection(self, AppliedFault(fault, names, MECHANISM, now, now))

    def revert(self, injection: FakeInjection) -> float:
        cluster = self.cluster
        cluster.advance()  # the ring stayed stalled until now
        fault = injection.applied.fault
        cluster.journal.append(("revert", fault.kind, self._ranks(injection.applied.hosts)))  # type: ignore[attr-defined]
        if fault.kind != "kill":  # type: ignore[attr-defined]
            cluster.stalls -= 1
        return cluster.clock()

    def mechanism(self, fault: FaultBase) -> str:
        return MECHANISM


class FakeBackend(Backend):
    name = "fake"
    traits = Traits("scripted ranks on a fake clock (tests of the orchestrator's logic)",
                    needs_root=False, user_namespace=False, network_faults=True,
                    link_counters=True, host_sysctls=True)

    def __init__(self, clock: FakeClock, refused: dict[tuple[str, int], str] | None = None) -> None:
        """`refused`: (fault kind, rank) -> why that rank's host does not allow the kind."""
        self.clock = clock
        self.refused = refused or {}
        self.journal: list[tuple[Any, ...]] = []
        self.clusters: list[FakeCluster] = []

    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> FakeCluster:
        """The fake cluster runs no process: `launchers` is not used."""
        self.journal.append(("up", spec.ranks))
        cluster = FakeCluster(spec, ledger, self.clock, self.journal, self.refused)
        self.clusters.append(cluster)
        return cluster

    def injector(self, ledger: Ledger, cluster: Cluster) -> FakeInjector:
        """The orchestrator's `make_injector` for this backend's clusters."""
        assert isinstance(cluster, FakeCluster)
        return FakeInjector(cluster)
