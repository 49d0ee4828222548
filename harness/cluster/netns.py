"""The default backend: every rank on its own Linux network namespace, one bridge.

The network is `chaos.topology`'s layout (switch `chaos-<run>-sw` with bridge br0 and the
control plane on 10.77.0.1; host `chaos-<run>-r<NNN>` with eth0 on port p<rank>), built
here from namespaces made for the run; every namespace is written to the ledger before it
is made. Ranks are forked into their namespaces by the rank launcher (`Launcher`).
`start_control` starts the control plane on the switch for both backends.
"""
from __future__ import annotations

import time
from pathlib import Path

from chaos import topology
from chaos.errors import HarnessError
from chaos.inject import UNDOS, undo_outstanding
from chaos.ledger import Ledger
from harness.cluster.api import STORE_PORT, Backend, Cluster, ClusterSpec, RankExit
from harness.job.control import LISTENING
from harness.cluster.launcher import Launcher, LauncherPool, exit_of, wait_for_text

CONTROL_READY_TIMEOUT_S = 20.0


def start_control(launcher: Launcher, ledger: Ledger, switch_ns: str, run_dir: Path, port: int) -> None:
    """The control plane (rendezvous store, detector) on the switch; returns once it listens."""
    log = run_dir / "logs" / "control.log"
    launcher.spawn(ledger, "control", "control", f"/run/netns/{switch_ns}", str(log), {"port": port})
    wait_for_text(log, LISTENING, CONTROL_READY_TIMEOUT_S)


class NetnsCluster(Cluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> None:
        self.spec = spec
        self._ledger = ledger
        self._launchers = launchers
        self.hosts = topology.hosts_of(spec.run_id, spec.ranks)
        self.store_address = topology.SWITCH_ADDRESS
        self.store_port = STORE_PORT
        self.switch_ns = topology.switch_namespace(spec.run_id)
        self._launcher: Launcher | None = None
        self.timings: dict[str, float] = {}  # bring-up phases, for benchmarks

    def build(self) -> None:
        topology.build(self._ledger, self.hosts, dict(self.spec.sysctls))

    def start_launcher(self) -> None:
        """Take the rank launcher first: a new one imports torch while the hosts are built."""
        self._launcher = self._launchers.take()

    def start_control(self) -> None:
        start_control(self.launcher, self._ledger, self.switch_ns, self.spec.run_dir, self.store_port)

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            raise HarnessError("the cluster is not started")
        return self._launcher

    def start_rank(self, rank: int, config: dict) -> int:
        return self._spawn(rank, "rank", config)

    def start_job(self, rank: int, launch: dict) -> int:
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
        return self._rank_exits(self.launcher.stop(names, deadline_s))

    def close(self) -> None:
        try:
            if self._launcher is not None:
                launcher, self._launcher = self._launcher, None
                self._launchers.give_back(launcher)
        finally:
            undo_outstanding(self._ledger, UNDOS)  # a namespace cluster makes only the fault library's ops


class NetnsBackend(Backend):
    name = "netns"

    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> NetnsCluster:
        cluster = NetnsCluster(spec, ledger, launchers)  # refuses more ranks than the network holds
        (spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            started = time.monotonic()
            cluster.start_launcher()
            cluster.build()
            built = time.monotonic()
            cluster.launcher.wait_ready()
            launched = time.monotonic()
            cluster.start_control()
            cluster.timings = {"hosts_s": built - started, "launcher_s": launched - started,
                               "control_s": time.monotonic() - launched}
        except BaseException:
            cluster.close()
            raise
        return cluster
