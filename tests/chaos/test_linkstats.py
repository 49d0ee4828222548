"""Bytes through a host's link (chaos.linkstats), read from its switch port: real namespaces."""
from __future__ import annotations

import pytest

from chaos import linkstats, netlink, topology
from chaos.calibrate import delivered
from chaos.linkstats import backlog_drops, link_bytes

DATAGRAMS = 200
HEADERS = 14 + 20 + 8  # ethernet, IPv4, UDP: the least one datagram puts on the wire


def test_backlog_drops_are_the_second_column_of_every_cpus_row(tmp_path, monkeypatch) -> None:
    stat = tmp_path / "softnet_stat"
    stat.write_text("309d7729 0007e6b0 00000018 00000000\n31cc0826 0000000a 00000014 00000000\n")
    monkeypatch.setattr(linkstats, "SOFTNET_STAT", str(stat))
    assert backlog_drops() == 0x7e6b0 + 10


@pytest.mark.requires_root
def test_a_port_counts_the_traffic_of_its_host_and_no_other(cluster) -> None:
    r0, r1, r2 = cluster.hosts
    assert delivered(r1, r0, 10) == 1.0  # the bridge learns r1's port: nothing to flood to r2
    before = link_bytes(cluster.hosts)
    assert delivered(r0, r1, DATAGRAMS) == 1.0
    grew = [b - a for a, b in zip(before, link_bytes(cluster.hosts), strict=True)]
    assert grew[0] >= DATAGRAMS * HEADERS and grew[1] >= DATAGRAMS * HEADERS
    assert grew[2] < grew[1] / 10


@pytest.mark.requires_root
def test_a_link_that_is_down_carries_nothing_and_a_removed_port_counts_zero(cluster) -> None:
    r0, r1, _ = cluster.hosts
    netlink.set_link_state(r1.switch_ns, r1.port, up=False)
    before = link_bytes(cluster.hosts)
    assert delivered(r0, r1, DATAGRAMS) == 0.0
    after = link_bytes(cluster.hosts)
    assert after[1] == before[1] and after[0] - before[0] >= DATAGRAMS * HEADERS
    topology.unplug(r1.switch_ns, r1)
    assert link_bytes(cluster.hosts)[1] == 0
