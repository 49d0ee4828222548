"""The local backend: every rank a plain process of the current user on the machine's
loopback; no namespace, no root (a shared GPU node, a sandbox without network namespaces).

The rank launcher forks the ranks and the control plane as on the netns backend, without
joining a namespace; every process is in the ledger, which the teardown and `chaos heal`
take back. A host has no link of its own: the scenario loader refuses link faults on this
backend (naming the backends that inject them) and so does the injector; process faults
(kill, pause) and gpu_hang act as on the others. The control plane and a user job's rank 0
listen on loopback ports found free at bring-up, below the kernel's ephemeral range, so
runs side by side do not collide.
"""
from __future__ import annotations

import socket
import zlib

from chaos import topology
from chaos.api import Host
from chaos.errors import HarnessError
from chaos.ledger import Ledger
from chaos.mechanism import Mechanism
from harness.cluster.api import Backend
from harness.cluster.spec import ClusterSpec, Traits
from harness.cluster.control_plane import start_control
from harness.cluster.forked import ForkedCluster
from harness.cluster.launcher import LauncherPool

LOOPBACK = "127.0.0.1"
PORTS = range(20000, 32000)  # below net.ipv4.ip_local_port_range's default 32768


def _free(port: int, kinds: tuple[int, ...]) -> bool:
    for kind in kinds:
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                return False
    return True


def free_ports(start: int, count: int) -> int:
    """The first port from `start` (wrapping within PORTS) where `count` consecutive ports
    are free for TCP and UDP on loopback."""
    both = (socket.SOCK_STREAM, socket.SOCK_DGRAM)
    for i in range(len(PORTS)):
        port = PORTS[(start + i) % (len(PORTS) - count)]
        if all(_free(port + k, both) for k in range(count)):
            return port
    raise HarnessError(f"no {count} consecutive free loopback ports in {PORTS.start}..{PORTS.stop - 1}")


class LocalCluster(ForkedCluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> None:
        super().__init__(spec, ledger, launchers)
        self.hosts = tuple(Host(name=topology.host_name(r), address=LOOPBACK, switch_ns=None, port=None,
                                ns_path=None, ifname="lo") for r in range(spec.ranks))
        self.store_address = LOOPBACK
        # the store, the detector on the next port, a user job's MASTER_PORT on the one after
        self.store_port = free_ports(zlib.crc32(spec.run_id.encode()), 3)
        self.job_port = self.store_port + 2

    def build(self) -> None:
        """Nothing to make: the hosts are the machine's loopback."""

    def start_control(self) -> None:
        start_control(self.launcher, self._ledger, None, self.spec.run_dir, self.store_port, host=LOOPBACK,
                      **({"name": self.hosts[-1].name} if self.spec.store_host else {}))

    def link_bytes(self) -> tuple[int, ...]:
        raise HarnessError("the local backend's hosts have no links to count bytes on")

    def mechanisms(self) -> dict[str, Mechanism]:
        from chaos.inject import process_mechanisms
        return process_mechanisms()


class LocalBackend(Backend):
    name = "local"
    traits = Traits("a plain process per rank on this machine's loopback",
                    needs_root=False, user_namespace=False, network_faults=False,
                    link_counters=False, host_sysctls=False, storage_faults=True, worker_faults=True,
                    store_host=True)

    def up(self, spec: ClusterSpec, ledger: Ledger, launchers: LauncherPool) -> LocalCluster:
        cluster = LocalCluster(spec, ledger, launchers)
        cluster.bring_up()
        return cluster
