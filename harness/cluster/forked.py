"""Clusters whose processes the rank launcher forks on this machine (the netns and local
backends): starting, reaping and stopping ranks, and giving the launcher back."""
from __future__ import annotations

import abc
import time

from chaos import topology
from chaos.errors import HarnessError
from chaos.undo import UNDOS, undo_outstanding
from chaos.ledger import Ledger
from harness.cluster.api import Cluster
from harness.cluster.control_plane import CONTROL
from harness.cluster.hosttmp import TemporaryFolders
from harness.cluster.spec import ClusterSpec, RankExit
from harness.cluster.launcher import PRELOAD_TIMEOUT_S, Launcher, LauncherPool, exit_of


class ForkedCluster(Cluster):
    """The hosts (`hosts`, `store_address`, `store_port`) are the subclass's; a rank is
    forked into its host's namespace (`Host.ns_path`; None: the launcher's own)."""

    def __init__(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> None:
        self.spec = spec
        self._ledger = ledger
        self._launchers = launchers
        self._launcher: Launcher | None = None
        self.timings: dict[str, float] = {}  # bring-up phases, for benchmarks
        self._temporary_folders = TemporaryFolders(ledger, spec.run_id)

    def bring_up(self) -> None:
        """Take the launcher, build the hosts while it imports torch, start the control
        plane; on any failure take back what was made and raise."""
        (self.spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            started = time.monotonic()
            self._launcher = self._launchers.take()
            if self.spec.preload is not None:  # imported while the hosts are built
                self._launcher.request_preload(list(self.spec.preload))
            self.build()
            built = time.monotonic()
            self.launcher.wait_ready()
            launched = time.monotonic()
            self.start_control()
            self.timings = {"hosts_s": built - started, "launcher_s": launched - started,
                            "control_s": time.monotonic() - launched}
        except BaseException:
            self.close()
            raise

    @abc.abstractmethod
    def build(self) -> None:
        """Make the hosts; every side effect goes to the ledger first."""

    @abc.abstractmethod
    def start_control(self) -> None:
        """Start the control plane where every host reaches it; returns once it listens."""

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            raise HarnessError("the cluster is not started")
        return self._launcher

    def start_rank(self, rank: int, config: dict) -> int:
        return self._spawn(rank, "rank", config)

    def start_job(self, rank: int, launch: dict) -> int:
        if launch["start"] == "preloaded":
            self.launcher.preload(launch["preload"], PRELOAD_TIMEOUT_S)
        launch = self._temporary_folders.launch(topology.host_name(rank), launch)
        return self._spawn(rank, "exec", {**launch, "rank": rank})

    def _spawn(self, rank: int, entry: str, config: dict) -> int:
        host = self.hosts[rank]
        log = str(self.spec.run_dir / "logs" / f"{host.name}.log")
        return self.launcher.spawn(self._ledger, host.name, entry, host.ns_path, log, config)

    def pid(self, rank: int) -> int | None:
        return self.launcher.pids.get(topology.host_name(rank))

    def _rank_exits(self, msgs: list[dict]) -> list[RankExit]:
        return [exit_of(topology.host_index(m["name"]), m) for m in msgs if m["name"].startswith("r")]

    def reap(self) -> list[RankExit]:
        return self._rank_exits(self.launcher.exits())

    def stop_ranks(self, deadline_s: float) -> list[RankExit]:
        names = [h.name for h in self.hosts]
        exits = self._rank_exits(self.launcher.stop(names, deadline_s))
        # then the control plane on the switch (on a host of its own it is one of `names`):
        # asked, it writes its heartbeat gaps a last time; the launcher's release SIGKILLs
        self.launcher.stop([CONTROL], deadline_s)
        return exits

    def close(self) -> None:
        try:
            if self._launcher is not None:
                launcher, self._launcher = self._launcher, None
                self._launchers.give_back(launcher)
        finally:
            undo_outstanding(self._ledger, UNDOS)  # these clusters make only the fault library's ops
