"""The default backend: every rank on its own Linux network namespace, one bridge.

The network is `chaos.topology`'s layout (switch `chaos-<run>-sw` with bridge br0 and the
control plane on 10.77.0.1; host `chaos-<run>-r<NNN>` with eth0 on port p<rank>), built
here from namespaces made for the run; every namespace is written to the ledger before it
is made. Ranks are forked into their namespaces by the rank launcher (`Launcher`); the
control plane runs on the switch (`harness.cluster.control_plane`), or as the last host's
process where the scenario gives it a host of its own (cluster.store: host).
"""
from __future__ import annotations

import os

from chaos import topology
from chaos.ledger import Ledger
from harness.cluster.api import Backend
from harness.cluster.spec import STORE_PORT, ClusterSpec, Traits
from harness.cluster.control_plane import start_control
from harness.cluster.forked import ForkedCluster
from harness.cluster.launcher import LauncherPool


class NetnsCluster(ForkedCluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> None:
        super().__init__(spec, ledger, launchers)
        self.hosts = topology.hosts_of(spec.run_id, spec.ranks)
        self.store_address = self.hosts[-1].address if spec.store_host else topology.SWITCH_ADDRESS
        self.store_port = STORE_PORT
        self.switch_ns = topology.switch_namespace(spec.run_id)

    def build(self) -> None:
        topology.build(self._ledger, self.hosts, dict(self.spec.sysctls))

    def start_control(self) -> None:
        if self.spec.store_host:
            start_control(self.launcher, self._ledger, self.hosts[-1].ns_path, self.spec.run_dir, self.store_port,
                          name=self.hosts[-1].name)
        else:
            start_control(self.launcher, self._ledger, topology.namespace_path(self.switch_ns), self.spec.run_dir,
                          self.store_port)


class NetnsBackend(Backend):
    name = "netns"
    traits = Traits("a Linux network namespace per rank on one bridge",
                    needs_root=True, user_namespace=True, network_faults=True,
                    link_counters=True, host_sysctls=True, storage_faults=True, worker_faults=True,
                    store_host=True)

    @classmethod
    def why_not_here(cls) -> str | None:
        from chaos.probe import capabilities
        why = super().why_not_here()
        if why or os.geteuid() != 0:  # an ordinary user's probe cannot tell: the run's user namespace will
            return why
        return None if capabilities().netns else capabilities().why_not("netns")

    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> NetnsCluster:
        cluster = NetnsCluster(spec, ledger, launchers)  # refuses more ranks than the network holds
        cluster.bring_up()
        return cluster
