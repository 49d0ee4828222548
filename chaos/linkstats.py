"""Bytes through a host's link, read from its switch port's counters (IFLA_STATS64).

The port (`chaos.topology`: p<N> on the switch's bridge) is the one place every packet of
a host crosses, whatever the fault mechanism and whichever transport the job chose (gloo,
NCCL sockets); a host's traffic that does not cross it (shared memory, NVLink, a process
that left the job) never reaches a fault put on the link. Counts are both directions
(received + sent by the port). Also what the host's kernel dropped because a CPU's
backlog of received packets was full (`backlog_drops`): veth pairs deliver through it, and
past about 32 ranks per core it overflows (docs/scale-journal.md). Reading only: no ledger entry,
no side effect.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from chaos import netlink
from chaos.api import Host


SOFTNET_STAT = "/proc/net/softnet_stat"


def backlog_drops() -> int:
    """Packets the kernel dropped since boot because a CPU's backlog of received packets
    (net.core.netdev_max_backlog, host-wide) was full: the second column of
    /proc/net/softnet_stat, one row per CPU, in hex. A count for the whole host."""
    return sum(int(row.split()[1], 16) for row in Path(SOFTNET_STAT).read_text().splitlines())


def link_bytes(hosts: Sequence[Host]) -> tuple[int, ...]:
    """Bytes each host's link has carried so far, in the order of `hosts` (one switch);
    0 for a port already gone (its counters went with it)."""
    if not hosts:
        return ()
    switch_ns = hosts[0].switch_ns
    with netlink.translated(f"read port counters in {switch_ns}"), netlink.route(switch_ns) as ipr:
        counted = {}
        for link in ipr.get_links():
            stats = link.get_attr("IFLA_STATS64")
            if stats is not None:
                counted[link.get_attr("IFLA_IFNAME")] = stats["rx_bytes"] + stats["tx_bytes"]
    return tuple(counted.get(h.port, 0) for h in hosts)
