"""The network layout of a run, built once in `chaos.topology` for both backends, calibration
and these tests: names and addresses, the ledger first, and a switch whose MAC never follows
a port (calibration's own copy of the layout once lacked that, and stalled ~15 s)."""
from __future__ import annotations

import errno
import os
import socket

import pytest

from chaos import netlink, topology
from chaos.api import Host
from chaos.calibrate import delivered, scratch_cluster
from chaos.errors import HarnessError, InjectionError
from chaos.ledger import Ledger

from .conftest import new_run_id, run_leftovers


def bridge_mac(switch_ns: str) -> str:
    with netlink.route(switch_ns) as ipr:
        return ipr.get_links(netlink.link_index(ipr, topology.BRIDGE))[0].get_attr("IFLA_ADDRESS")


def test_the_layout_of_a_host() -> None:
    assert topology.host_at("ab12", 5) == Host(
        name="r005", address="10.77.0.15", switch_ns="chaos-ab12-sw", port="p5",
        ns_path="/run/netns/chaos-ab12-r005", ifname="eth0")
    assert topology.host_index("r005") == 5
    assert topology.SWITCH_ADDRESS == "10.77.0.1"
    assert [h.address for h in topology.hosts_of("ab12", 3)] == ["10.77.0.10", "10.77.0.11", "10.77.0.12"]


def test_more_hosts_than_the_network_holds_are_refused() -> None:
    assert len(topology.hosts_of("ab12", topology.MAX_HOSTS)) == topology.MAX_HOSTS
    with pytest.raises(HarnessError, match=f"{topology.MAX_HOSTS + 1} hosts do not fit 10.77.0.0/16"):
        topology.hosts_of("ab12", topology.MAX_HOSTS + 1)


@pytest.mark.requires_root
def test_every_namespace_is_in_the_ledger_before_it_is_made(cluster) -> None:
    entries = [e for e in cluster.ledger.entries() if e.op == "netns"]
    assert [e.args["name"] for e in entries] == [f"chaos-{cluster.run_id}-sw"] + [
        f"chaos-{cluster.run_id}-r{r:03d}" for r in range(3)]
    assert all(e.state == "done" for e in entries)


@pytest.mark.requires_root
def test_the_switch_keeps_its_mac_when_a_port_goes(cluster) -> None:
    sw = cluster.hosts[0].switch_ns
    assert bridge_mac(sw) == topology.BRIDGE_MAC
    assert delivered(cluster.hosts[1], cluster.hosts[2]) == 1.0
    topology.unplug(sw, cluster.hosts[0])
    topology.unplug(sw, cluster.hosts[0])  # already gone: fine
    assert bridge_mac(sw) == topology.BRIDGE_MAC
    assert delivered(cluster.hosts[1], cluster.hosts[2]) == 1.0


def ipv6_addresses(ns: str) -> list[str]:
    with netlink.route(ns) as ipr:
        return [f"{ipr.get_links(a['index'])[0].get_attr('IFLA_IFNAME')} {a.get_attr('IFA_ADDRESS')}"
                for a in ipr.get_addr(family=socket.AF_INET6)
                if ipr.get_links(a["index"])[0].get_attr("IFLA_IFNAME") != "lo"]


@pytest.mark.requires_root
def test_no_link_of_a_run_has_an_ipv6_address(cluster) -> None:
    # Such a link talks on its own (router solicitations, DAD, MLD); the bridge floods that
    # to every port, and a port's byte count then charges it to an idle host.
    namespaces = [cluster.hosts[0].switch_ns] + [h.ns_path for h in cluster.hosts]
    assert delivered(cluster.hosts[0], cluster.hosts[1]) == 1.0
    assert {ns: ipv6_addresses(ns) for ns in namespaces} == {ns: [] for ns in namespaces}


@pytest.mark.requires_root
def test_calibration_builds_the_same_layout(state_dir) -> None:
    run_id = new_run_id("c")
    with scratch_cluster(run_id, Ledger(run_id)) as hosts:
        assert hosts == topology.hosts_of(run_id, 2)
        assert bridge_mac(hosts[0].switch_ns) == topology.BRIDGE_MAC
        assert delivered(hosts[0], hosts[1]) == 1.0
    assert run_leftovers(run_id) == ([], [])


@pytest.mark.requires_root
def test_a_namespace_is_made_by_a_thread_of_its_own_and_named_without_a_fork(cluster, monkeypatch) -> None:
    """`netlink.create_namespace` forks nothing (pyroute2's netns.create forked the harness for
    each, 13-20 ms a namespace on a slow day): a thread moves into a new namespace and names
    it. Each host has its own, this thread stays where it was, a name taken is refused."""
    def no_fork() -> int:
        raise AssertionError("a fork to make a namespace")
    monkeypatch.setattr(os, "fork", no_fork)
    mine = os.readlink("/proc/thread-self/ns/net")
    extra = topology.namespace_name(cluster.run_id, "extra")
    topology.make_namespace(cluster.ledger, extra)  # recorded first: the fixture's heal removes it
    namespaces = [h.ns_path for h in cluster.hosts] + [f"/run/netns/{extra}"]
    assert len({f"net:[{os.stat(path).st_ino}]" for path in namespaces} | {mine}) == 5
    with pytest.raises(InjectionError) as taken:
        netlink.create_namespace(extra)
    assert taken.value.errno == errno.EEXIST
    assert os.readlink("/proc/thread-self/ns/net") == mine


@pytest.mark.requires_root
def test_a_socket_is_made_inside_a_namespace_without_moving_this_thread(cluster) -> None:
    """`netlink.socket_in` enters the namespace on a thread of its own (no fork): the socket
    sees the host's interface, this thread stays where it was, a missing namespace is
    ENOENT (which a revert may tolerate), never created."""
    host = cluster.hosts[0]
    mine = os.readlink("/proc/thread-self/ns/net")
    with netlink.route(host.ns_path) as ipr:
        assert netlink.link_index(ipr, host.ifname) > 0
    with netlink.socket_in(host.ns_path, socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host.address, 0))  # only there does this address exist
    assert os.readlink("/proc/thread-self/ns/net") == mine
    missing = topology.namespace_name(cluster.run_id, "missing")
    with pytest.raises(InjectionError) as raised, netlink.translated("open"), netlink.route(missing):
        pass
    assert raised.value.errno == errno.ENOENT and missing not in netlink.list_namespaces()
