"""The default backend: every rank on its own Linux network namespace, one bridge.

    chaos-<run>-sw      the switch: bridge br0 (10.77.0.1/16, the control plane listens
                        here) and one port per host, p<rank>, the switch side of its veth
    chaos-<run>-r<NNN>  one per rank: eth0 (10.77.x.y/16), the host side of the veth

The root namespace is never touched. Every namespace is written to the ledger before it is
made; removing the switch namespace removes the bridge and every veth with it.
"""
from __future__ import annotations

import ipaddress
import time
from pathlib import Path

from chaos import netlink
from chaos.api import Host
from chaos.errors import HarnessError
from chaos.heal import namespace_name
from chaos.inject import undo_outstanding
from chaos.ledger import Ledger
from harness.cluster.api import STORE_PORT, Backend, Cluster, ClusterSpec, RankExit
from harness.job.control import LISTENING
from harness.cluster.launcher import Launcher, exit_of, wait_for_text

NETWORK = ipaddress.ip_network("10.77.0.0/16")
SWITCH_ADDRESS = str(NETWORK.network_address + 1)
FIRST_HOST = 10
BRIDGE = "br0"
MAX_RANKS = NETWORK.num_addresses - FIRST_HOST - 2
CONTROL_READY_TIMEOUT_S = 20.0
BRIDGE_MAC = "02:77:00:00:00:01"  # locally administered; fixed so that it never follows a port


def rank_name(rank: int) -> str:
    return f"r{rank:03d}"


def host_address(rank: int) -> str:
    return str(NETWORK.network_address + FIRST_HOST + rank)


def port_name(rank: int) -> str:
    return f"p{rank}"


def build_switch(ledger: Ledger, switch_ns: str) -> None:
    """The switch namespace with its bridge (the control plane's address); hosts plug in later."""
    entry = ledger.record("netns", name=switch_ns)
    netlink.create_namespace(switch_ns)
    ledger.mark(entry, "done")
    with netlink.translated("build switch"), netlink.route(switch_ns) as ipr:
        ipr.link("set", index=netlink.link_index(ipr, "lo"), state="up")
        # A fixed MAC: a bridge without one takes its lowest port's, and changes it when
        # that port goes; every host's ARP entry for the switch then points nowhere and
        # its traffic to the control plane stalls for ~15 s until the entry is renewed.
        ipr.link("add", ifname=BRIDGE, kind="bridge", address=BRIDGE_MAC)
        bridge = netlink.link_index(ipr, BRIDGE)
        ipr.addr("add", index=bridge, address=SWITCH_ADDRESS, prefixlen=NETWORK.prefixlen)
        ipr.link("set", index=bridge, state="up")


def start_control(launcher: Launcher, switch_ns: str, run_dir: Path, port: int) -> None:
    """The control plane (rendezvous store, detector) on the switch; returns once it listens."""
    log = run_dir / "logs" / "control.log"
    launcher.spawn("control", "control", f"/run/netns/{switch_ns}", str(log), {"port": port})
    wait_for_text(log, LISTENING, CONTROL_READY_TIMEOUT_S)


class NetnsCluster(Cluster):
    def __init__(self, spec: ClusterSpec, ledger: Ledger) -> None:
        self.spec = spec
        self._ledger = ledger
        self.store_address = SWITCH_ADDRESS
        self.store_port = STORE_PORT
        self.switch_ns = namespace_name(spec.run_id, "sw")
        self._launcher: Launcher | None = None
        self.timings: dict[str, float] = {}  # bring-up phases, for benchmarks
        self.hosts = tuple(
            Host(name=rank_name(r), address=host_address(r), switch_ns=self.switch_ns,
                 port=port_name(r), ns_path=f"/run/netns/{namespace_name(spec.run_id, rank_name(r))}")
            for r in range(spec.ranks))

    def _make_namespace(self, name: str) -> None:
        entry = self._ledger.record("netns", name=name)
        netlink.create_namespace(name)
        self._ledger.mark(entry, "done")

    def build(self) -> None:
        build_switch(self._ledger, self.switch_ns)
        for host in self.hosts:
            self._make_namespace(Path(host.ns_path).name)
        prefix = NETWORK.prefixlen
        with netlink.translated("wire hosts"), netlink.route(self.switch_ns) as ipr:
            bridge = netlink.link_index(ipr, BRIDGE)
            for host in self.hosts:
                ipr.link("add", ifname=host.port, kind="veth",
                         peer={"ifname": host.ifname, "net_ns_fd": Path(host.ns_path).name})
                ipr.link("set", index=netlink.link_index(ipr, host.port), master=bridge, state="up")
        for host in self.hosts:
            with netlink.translated(f"configure {host.name}"), netlink.route(Path(host.ns_path).name) as ipr:
                eth = netlink.link_index(ipr, host.ifname)
                ipr.addr("add", index=eth, address=host.address, prefixlen=prefix)
                ipr.link("set", index=eth, state="up")
                ipr.link("set", index=netlink.link_index(ipr, "lo"), state="up")

    def start_launcher(self) -> None:
        """Start the rank launcher first: it imports torch while the hosts are built."""
        self._launcher = Launcher(self._ledger)

    def start_control(self) -> None:
        start_control(self.launcher, self.switch_ns, self.spec.run_dir, self.store_port)

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            raise HarnessError("the cluster is not started")
        return self._launcher

    def start_rank(self, rank: int, config: dict) -> int:
        host = self.hosts[rank]
        log = str(self.spec.run_dir / "logs" / f"{host.name}.log")
        return self.launcher.spawn(host.name, "rank", host.ns_path, log, config)

    def pid(self, rank: int) -> int | None:
        return self.launcher.pids.get(rank_name(rank))

    def _rank_exits(self, msgs: list[dict]) -> list[RankExit]:
        return [exit_of(int(m["name"][1:]), m) for m in msgs if m["name"].startswith("r")]

    def reap(self) -> list[RankExit]:
        return self._rank_exits(self.launcher.exits())

    def stop_ranks(self, deadline_s: float) -> list[RankExit]:
        names = [h.name for h in self.hosts]
        return self._rank_exits(self.launcher.stop(names, deadline_s))

    def close(self) -> None:
        try:
            if self._launcher is not None:
                self._launcher.close()
        finally:
            undo_outstanding(self._ledger)


class NetnsBackend(Backend):
    name = "netns"

    def up(self, spec: ClusterSpec, ledger: Ledger) -> NetnsCluster:
        if spec.ranks > MAX_RANKS:
            raise HarnessError(f"{spec.ranks} ranks do not fit {NETWORK}; at most {MAX_RANKS}")
        (spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        cluster = NetnsCluster(spec, ledger)
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
