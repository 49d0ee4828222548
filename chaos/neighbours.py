"""Every host starts knowing its peers' link addresses, because all hosts share one ARP table.

The hosts of a run live in one kernel, and a kernel keeps one neighbour (ARP) table for all
its network namespaces (and runs), with host-wide limits set only in the root namespace
(net.ipv4.neigh.default.gc_thresh3: 1024 entries; past gc_thresh2, 512, the kernel may drop
only entries older than 5 s). A full mesh of N hosts needs N*(N-1) entries. Past ~30 hosts
the table fills during bring-up: the kernel cannot make the entry a packet needs and drops
the packet ("neighbor table overflow!" in the kernel log, TcpExtTCPRetransFail in nstat),
each lost SYN waits for its retry at 1, 3, 7 s, and gloo's full mesh misses its timeout
(measured on 2 cores: 6 to 32 of 32 ranks, and 63 or 64 of 64, never formed the group).

So every host, and the switch, starts with an entry for each peer, made the way the kernel
takes one learned elsewhere (``extern_learn``): exempt from those limits and never
collected, otherwise an ordinary entry: STALE with the peer's MAC, confirmed by traffic,
probed, FAILED when the peer stops answering. A fault meets the same ARP as before; only
each pair's first broadcast resolution is skipped. A host's MAC follows from its address
(`mac_of`), so its peers' entries stay true when its link is made again (a container
restarted). The entries go with the namespaces: nothing to record or undo.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from chaos import netlink, proc
from chaos.api import Host

RTM_NEWNEIGH = 28
NLM_F_REPLACE = 0x100
NDA_DST = 1
NDA_LLADDR = 2
NUD_STALE = 0x04
NTF_EXT_LEARNED = 0x10
_NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
# Requests per send: the kernel answers a batch while it is being sent, and acknowledgements
# past the socket's receive buffer (~200 KB, about 300 of them here) are lost (ENOBUFS).
BATCH = 128


@dataclass(frozen=True)
class Station:
    """One end of a link as its peers see it: the device in its namespace, its IPv4 and MAC."""

    ns_path: str
    ifname: str
    address: str
    mac: str


def mac_of(address: str) -> str:
    """The MAC of the host at IPv4 `address`: locally administered 02, then 77 or 76 so that
    the last five bytes' bits have even parity, then the address's 4 bytes. Two hosts' MACs thus differ
    in two bits or more: a frame with one bit flipped (a corrupt fault, which a real switch
    drops by its FCS and a Linux bridge forwards) never carries a peer's MAC as its source,
    which would make the switch send that peer's traffic to the sender's port."""
    packed = ipaddress.IPv4Address(address).packed
    parity = sum(bin(b).count("1") for b in packed) % 2
    return ":".join(f"{b:02x}" for b in bytes([0x02, 0x77 ^ parity]) + packed)


def station(host: Host) -> Station:
    return Station(host.ns_path, host.ifname, host.address, mac_of(host.address))


def introduce(hosts: Sequence[Host], peers: Sequence[Host], switch: Station) -> None:
    """Give each of `hosts` an entry for the switch and for each other of `peers` (the run's
    hosts), and the switch an entry for each of `hosts`."""
    known = [station(p) for p in peers]
    for host in hosts:
        learn(station(host), [switch] + [p for p in known if p.address != host.address])
    learn(switch, [station(h) for h in hosts])


def learn(where: Station, neighbours: Sequence[Station]) -> None:
    """Extern-learned STALE entries for `neighbours` on `where`'s device, in its namespace;
    one that is there already is replaced."""
    # setns(2) moves only the calling thread: a thread of its own enters the namespace and
    # ends with it, where pyroute2 would fork a process per namespace (~14 ms each).
    with ThreadPoolExecutor(1, thread_name_prefix="neighbours") as pool:
        pool.submit(_learn_here, where, neighbours).result()


def _learn_here(where: Station, neighbours: Sequence[Station]) -> None:
    what = f"learn {len(neighbours)} neighbours on {where.ifname} in {where.ns_path}"
    with netlink.translated(what):
        proc.enter_netns(where.ns_path)
        index = socket.if_nametoindex(where.ifname)
    flags = netlink.NLM_F_REQUEST | netlink.NLM_F_ACK | netlink.NLM_F_CREATE | NLM_F_REPLACE
    messages = [netlink.nlmsg(RTM_NEWNEIGH, flags, _NDMSG.pack(socket.AF_INET, index, NUD_STALE,
                                                               NTF_EXT_LEARNED, 0)
                              + netlink.nla(NDA_DST, socket.inet_aton(n.address))
                              + netlink.nla(NDA_LLADDR, bytes.fromhex(n.mac.replace(":", ""))))
                for n in neighbours]
    for start in range(0, len(messages), BATCH):
        netlink.send_acked(None, netlink.NETLINK_ROUTE, messages[start:start + BATCH], what)
