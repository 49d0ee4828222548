"""Hosts start knowing their peers' MACs (`chaos.neighbours`): the kernel's one ARP table,
shared by every namespace, holds the full mesh of only ~30 hosts, and past that gloo's
group did not form."""
from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest

from chaos import netlink, neighbours, topology
from chaos.calibrate import delivered

GC_THRESH3 = Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3")


def learned(ns: str, ifname: str) -> dict[str, tuple[str, int, int]]:
    """The IPv4 unicast neighbour entries on `ifname` in `ns`: address -> (MAC, state, flags)."""
    with netlink.route(ns) as ipr:
        found = ipr.get_neighbours(family=socket.AF_INET, ifindex=netlink.link_index(ipr, ifname))
    return {n.get_attr("NDA_DST"): (n.get_attr("NDA_LLADDR"), n["state"], n["flags"])
            for n in found if not ipaddress.ip_address(n.get_attr("NDA_DST")).is_multicast}


def mac(ns: str, ifname: str) -> str:
    with netlink.route(ns) as ipr:
        return ipr.get_links(netlink.link_index(ipr, ifname))[0].get_attr("IFLA_ADDRESS")


def test_a_hosts_mac_follows_from_its_address() -> None:
    assert neighbours.mac_of("10.77.0.15") == "02:77:0a:4d:00:0f"
    macs = {neighbours.mac_of(h.address) for h in topology.hosts_of("ab12", 4096)}
    assert len(macs) == 4096 and topology.BRIDGE_MAC not in macs
    assert all(int(m[:2], 16) & 0b11 == 0b10 for m in macs)  # unicast, locally administered
    # a corrupt fault's flipped bit never turns one host's MAC into another's
    flips = {int(m.replace(":", ""), 16) ^ (1 << bit) for m in macs for bit in range(48)}
    assert not flips & {int(m.replace(":", ""), 16) for m in macs}


@pytest.mark.requires_root
def test_every_host_knows_the_switch_and_its_peers_and_the_switch_knows_them(cluster) -> None:
    hosts = cluster.hosts
    for h in hosts:
        assert mac(h.ns_path, h.ifname) == neighbours.mac_of(h.address)
        entries = learned(h.ns_path, h.ifname)
        expected = {topology.SWITCH_ADDRESS: topology.BRIDGE_MAC} | {
            p.address: neighbours.mac_of(p.address) for p in hosts if p != h}
        assert {a: m for a, (m, _, _) in entries.items()} == expected
        assert all(flags & neighbours.NTF_EXT_LEARNED for _, _, flags in entries.values())
    switch = learned(hosts[0].switch_ns, topology.BRIDGE)
    assert {a: m for a, (m, _, _) in switch.items()} == {h.address: neighbours.mac_of(h.address) for h in hosts}
    assert delivered(hosts[1], hosts[2]) == 1.0  # and the entries carry traffic


@pytest.mark.requires_root
def test_learned_entries_are_not_held_to_the_kernels_table_limit(cluster) -> None:
    """More entries than the whole kernel's table may hold (gc_thresh3), in one namespace:
    an entry the kernel makes itself, or an ordinary one added by hand, fails past that."""
    host = cluster.hosts[0]
    many = int(GC_THRESH3.read_text()) + 100
    strangers = [neighbours.Station("", "", address, neighbours.mac_of(address))
                 for address in (str(topology.NETWORK.network_address + 1000 + i) for i in range(many))]
    neighbours.learn(neighbours.station(host), strangers)
    entries = learned(host.ns_path, host.ifname)
    assert all(entries[s.address][0] == s.mac for s in strangers)
    assert {entries[s.address][1] for s in strangers} == {neighbours.NUD_STALE}
