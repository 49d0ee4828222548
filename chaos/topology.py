"""The network layout of a run, in one place: the switch, its hosts, their names and addresses.

    chaos-<run>-sw      the switch namespace: bridge br0 with a fixed MAC and 10.77.0.1/16
                        (the control plane's address), one port p<N> per host
    chaos-<run>-r<NNN>  host N's namespace: eth0, 10.77.0.(10+N)/16, the other end of p<N>
                        (its MAC follows from its address: `chaos.neighbours`)

Both host backends (namespaces, containers), calibration and the tests build it here. The
root namespace is never touched. Every namespace is written to the ledger (op ``netns``)
before it is made, or, for a container's, before it is pinned under the host's name;
removing the switch namespace removes the bridge and every veth with it. Everything is named
after the run, so a heal finds it even where a ledger was lost.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from chaos.api import Host
from chaos.errors import HarnessError
from chaos.ledger import Ledger

if TYPE_CHECKING:
    from pyroute2 import IPRoute

NAMESPACE_PREFIX = "chaos-"
NETWORK = ipaddress.ip_network("10.77.0.0/16")
SWITCH_ADDRESS = str(NETWORK.network_address + 1)  # the bridge's: the control plane listens here
FIRST_HOST = 10
BRIDGE = "br0"
BRIDGE_MAC = "02:77:00:00:00:01"  # locally administered; fixed so that it never follows a port
MAX_HOSTS = NETWORK.num_addresses - FIRST_HOST - 2


def namespace_name(run_id: str, part: str) -> str:
    return f"{NAMESPACE_PREFIX}{run_id}-{part}"


def namespace_path(name: str) -> str:
    """Where the named namespace is pinned (ip-netns(8)'s place; in a user namespace of the
    run's own, the user's: chaos.userns)."""
    from chaos import userns
    return f"{userns.netns_dir()}/{name}"


def switch_namespace(run_id: str) -> str:
    return namespace_name(run_id, "sw")


def host_name(index: int) -> str:
    return f"r{index:03d}"


def host_index(name: str) -> int:
    return int(name[1:])


def host_address(index: int) -> str:
    return str(NETWORK.network_address + FIRST_HOST + index)


def port_name(index: int) -> str:
    return f"p{index}"


def host_at(run_id: str, index: int) -> Host:
    """Host `index` of the run, its namespace pinned as chaos-<run>-r<NNN>."""
    return Host(name=host_name(index), address=host_address(index), switch_ns=switch_namespace(run_id),
                port=port_name(index), ns_path=namespace_path(namespace_name(run_id, host_name(index))))


def hosts_of(run_id: str, count: int) -> tuple[Host, ...]:
    """The run's `count` hosts; refused when they do not fit the network."""
    if count > MAX_HOSTS:
        raise HarnessError(f"{count} hosts do not fit {NETWORK}; at most {MAX_HOSTS}")
    return tuple(host_at(run_id, i) for i in range(count))


def make_namespace(ledger: Ledger, name: str, pid: int | None = None) -> None:
    """Record, then make namespace `name`; with `pid`, name that process's network namespace
    instead (as `ip netns attach` does), so that it outlives the process."""
    from chaos import netlink  # pyroute2: only where the layout is built, not where it is named
    path = namespace_path(name)  # the pin (a user's own folder in a user namespace: chaos.userns)
    entry = ledger.record("netns", name=name, path=path)
    if pid is None:
        netlink.create_namespace(path)
    else:
        netlink.attach_namespace(path, pid)
    ledger.mark(entry, "done")


# Runs speak IPv4 only. A link with an IPv6 link-local address sends router solicitations,
# DAD probes and MLD reports on its own; the bridge floods them to every port, and a port's
# byte counter (`chaos.linkstats`) then charges them to a host that sent nothing.
_NO_IPV6_ADDRESSES = {"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]}  # IN6_ADDR_GEN_MODE_NONE


def _bring_up(ipr: IPRoute, index: int, **attrs: Any) -> None:
    """Up, without IPv6 link-local addresses (set while still down, before any are made)."""
    ipr.link("set", index=index, IFLA_AF_SPEC=_NO_IPV6_ADDRESSES)
    ipr.link("set", index=index, state="up", **attrs)


def build_switch(ledger: Ledger, switch_ns: str) -> None:
    """The switch namespace with its bridge (the control plane's address); hosts plug in later."""
    from chaos import netlink  # pyroute2: only where the layout is built, not where it is named
    make_namespace(ledger, switch_ns)
    with netlink.translated("build switch"), netlink.route(switch_ns) as ipr:
        ipr.link("set", index=netlink.link_index(ipr, "lo"), state="up")
        # A fixed MAC: a bridge without one takes its lowest port's, and changes it when
        # that port goes; every host's ARP entry for the switch then points nowhere and
        # its traffic to the control plane stalls for ~15 s until the entry is renewed.
        ipr.link("add", ifname=BRIDGE, kind="bridge", address=BRIDGE_MAC)
        bridge = netlink.link_index(ipr, BRIDGE)
        ipr.addr("add", index=bridge, address=SWITCH_ADDRESS, prefixlen=NETWORK.prefixlen)
        _bring_up(ipr, bridge)


def plug(switch_ns: str, hosts: Sequence[Host], peers: Sequence[Host] | None = None,
         settings: Mapping[str, str] | None = None) -> None:
    """Link each host to the switch: a veth from its port on the bridge to its eth0 (made in
    the host's namespace, which must exist), the host's own network `settings` (net.*
    sysctls, chaos.sysctl), its addresses, both ends up; then each host knows the switch and
    `peers` (the run's hosts; default `hosts`), the switch each host."""
    from chaos import neighbours, netlink, sysctl  # pyroute2: only where the layout is built, not where it is named
    with netlink.translated("plug hosts into the switch"), netlink.route(switch_ns) as ipr:
        bridge = netlink.link_index(ipr, BRIDGE)
        for h in hosts:
            ipr.link("add", ifname=h.port, kind="veth", peer={"ifname": h.ifname, "net_ns_fd": h.ns_path,
                                                              "address": neighbours.mac_of(h.address)})
            _bring_up(ipr, netlink.link_index(ipr, h.port), master=bridge)
    for h in hosts:
        sysctl.apply(h.ns_path, settings or {})  # before its link is up: in force from its first packet
        with netlink.translated(f"configure {h.name}"), netlink.route(h.ns_path) as ipr:
            eth = netlink.link_index(ipr, h.ifname)
            ipr.addr("add", index=eth, address=h.address, prefixlen=NETWORK.prefixlen)
            _bring_up(ipr, eth)
            ipr.link("set", index=netlink.link_index(ipr, "lo"), state="up")
    switch = neighbours.Station(namespace_path(switch_ns), BRIDGE, SWITCH_ADDRESS, BRIDGE_MAC)
    neighbours.introduce(hosts, hosts if peers is None else peers, switch)


def unplug(switch_ns: str, host: Host) -> None:
    """Remove a host's port (and so its veth); one already gone is fine."""
    from chaos import netlink  # pyroute2: only where the layout is built, not where it is named
    with netlink.translated(f"remove port {host.port}", gone_ok=True), netlink.route(switch_ns) as ipr:
        found = ipr.link_lookup(ifname=host.port)
        if found:
            ipr.link("del", index=found[0])


def build(ledger: Ledger, hosts: Sequence[Host], settings: Mapping[str, str] | None = None) -> None:
    """The switch `hosts` share (as `hosts_of` lays them out), a namespace for each of them
    with its network `settings`, and their links."""
    switch_ns = hosts[0].switch_ns
    build_switch(ledger, switch_ns)
    for h in hosts:
        make_namespace(ledger, Path(h.ns_path).name)
    plug(switch_ns, hosts, settings=settings)
