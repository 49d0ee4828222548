"""nftables rules built as raw netlink, for the switch namespace's bridge.

pyroute2's nftables helper encodes only part of the expression set (its numgen attribute
names are wrong), so the few expressions used here are encoded by hand: `meta` (which
bridge port a frame came in on or goes out of), `cmp`, `numgen` and `byteorder` (a random
draw per frame, as `nft ... numgen random mod N < K` compiles it), an immediate verdict,
and the xtables-compat `target` (this kernel has the NFQUEUE target but not nft's own `queue`).
Every fault owns one table, named after its ledger entry, so removing the fault is
removing its table, and faults never edit each other's rules.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from chaos import netlink
from chaos.api import Host
from chaos.errors import UnsupportedFault, UsageError
from chaos.faults import Blackhole, FaultBase, Loss, Partition
from chaos.ledger import Entry, Ledger
from chaos.mechanism import ClusterMechanism, Mechanism
from chaos.undotable import UndoTable

NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_NEWTABLE, NFT_MSG_GETTABLE, NFT_MSG_DELTABLE = 0, 1, 2
NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE = 3, 6
NFPROTO_IPV4, NFPROTO_BRIDGE = 2, 7
FAMILIES = {"inet": 1, "ip": 2, "arp": 3, "netdev": 5, "bridge": 7, "ip6": 10}

# Hooks of the bridge family: frames entering from a port, crossing between ports, leaving.
BRIDGE_PREROUTING, BRIDGE_FORWARD, BRIDGE_POSTROUTING = 0, 2, 4
# Hooks of the ip family, seen by bridged packets once bridge netfilter is on.
IP_LOCAL_IN, IP_FORWARD = 1, 2
XT_PHYSDEV_OP_IN, XT_PHYSDEV_OP_OUT = 0x01, 0x02
NFT_META_IIFNAME, NFT_META_OIFNAME = 6, 7
NFT_REG_VERDICT, NFT_REG_1 = 0, 1
NFT_CMP_EQ, NFT_CMP_LT = 0, 2
NFT_NG_RANDOM = 1
NFT_BYTEORDER_HTON = 1
DRAW_MODULUS = 1_000_000  # a random drop's resolution: one in a million
NF_DROP = 0
NFQ_FLAG_BYPASS = 0x01  # no listener on the queue: accept instead of drop
IFNAMSIZ = 16

_be32 = struct.Struct(">I").pack


def _msg(cmd: int, family: int, flags: int, *attrs: bytes) -> bytes:
    body = struct.pack("=BBH", family, 0, 0) + b"".join(attrs)
    return netlink.nlmsg((NFNL_SUBSYS_NFTABLES << 8) | cmd, netlink.NLM_F_REQUEST | flags, body)


def _batch(*messages: bytes) -> list[bytes]:
    delimiter = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(NFNL_SUBSYS_NFTABLES))
    return [netlink.nlmsg(NFNL_MSG_BATCH_BEGIN, netlink.NLM_F_REQUEST, delimiter), *messages,
            netlink.nlmsg(NFNL_MSG_BATCH_END, netlink.NLM_F_REQUEST, delimiter)]


def _expr(name: str, *attrs: bytes) -> bytes:
    return netlink.nested(1, netlink.nla(1, name.encode() + b"\0"), netlink.nested(2, *attrs))


def port_is(port: str, outgoing: bool) -> list[bytes]:
    """Match frames entering from (or leaving through) bridge port `port`."""
    key = NFT_META_OIFNAME if outgoing else NFT_META_IIFNAME
    name = port.encode().ljust(IFNAMSIZ, b"\0")
    return [_expr("meta", netlink.nla(1, _be32(NFT_REG_1)), netlink.nla(2, _be32(key))),
            _expr("cmp", netlink.nla(1, _be32(NFT_REG_1)), netlink.nla(2, _be32(NFT_CMP_EQ)),
                  netlink.nested(3, netlink.nla(1, name)))]


def physdev_is(port: str, outgoing: bool) -> list[bytes]:
    """xtables physdev match (revision 0) for the ip family: bridged packets entering from
    (or leaving through) bridge port `port`. Needs bridge netfilter on in the namespace."""
    name = port.encode().ljust(IFNAMSIZ, b"\0")
    mask = (b"\xff" * (len(port) + 1)).ljust(IFNAMSIZ, b"\0")  # the name and its NUL, exactly
    empty = b"\0" * IFNAMSIZ
    fields = (empty, empty, name, mask) if outgoing else (name, mask, empty, empty)
    op = XT_PHYSDEV_OP_OUT if outgoing else XT_PHYSDEV_OP_IN
    info = (b"".join(fields) + struct.pack("=BB", 0, op)).ljust(72, b"\0")  # XT_ALIGN'd
    return [_expr("match", netlink.nla(1, b"physdev\0"), netlink.nla(2, _be32(0)), netlink.nla(3, info))]


def chance(p: float) -> list[bytes]:
    """Match a frame with probability `p`, drawn afresh for each frame: numgen random mod M,
    to network order, less than p * M."""
    below = round(p * DRAW_MODULUS)
    return [_expr("numgen", netlink.nla(1, _be32(NFT_REG_1)), netlink.nla(2, _be32(DRAW_MODULUS)),
                  netlink.nla(3, _be32(NFT_NG_RANDOM))),
            _expr("byteorder", netlink.nla(1, _be32(NFT_REG_1)), netlink.nla(2, _be32(NFT_REG_1)),
                  netlink.nla(3, _be32(NFT_BYTEORDER_HTON)), netlink.nla(4, _be32(4)), netlink.nla(5, _be32(4))),
            _expr("cmp", netlink.nla(1, _be32(NFT_REG_1)), netlink.nla(2, _be32(NFT_CMP_LT)),
                  netlink.nested(3, netlink.nla(1, _be32(below))))]


def drop() -> list[bytes]:
    verdict = netlink.nested(2, netlink.nla(1, _be32(NF_DROP)))
    return [_expr("immediate", netlink.nla(1, _be32(NFT_REG_VERDICT)), netlink.nested(2, verdict))]


def nfqueue(queue: int) -> list[bytes]:
    """The xtables NFQUEUE target (revision 3) with --queue-bypass: a dead delayer never
    black-holes the link, its packets just go through undelayed."""
    info = struct.pack("=HHH", queue, 1, NFQ_FLAG_BYPASS).ljust(8, b"\0")  # XT_ALIGN'd
    return [_expr("target", netlink.nla(1, b"NFQUEUE\0"), netlink.nla(2, _be32(3)),
                  netlink.nla(3, info))]


@dataclass(frozen=True)
class Chain:
    name: str
    hook: int
    priority: int
    rules: tuple[tuple[bytes, ...], ...]  # each rule: its expressions, in order


def table_batch(table: str, chains: Sequence[Chain], family: int = NFPROTO_BRIDGE) -> list[bytes]:
    """One batch that creates `table` (exclusively: it must not exist) with its chains and rules."""
    create = netlink.NLM_F_CREATE | netlink.NLM_F_ACK
    name = netlink.nla(1, table.encode() + b"\0")
    messages = [_msg(NFT_MSG_NEWTABLE, family, create | netlink.NLM_F_EXCL, name)]
    for chain in chains:
        hook = netlink.nested(4, netlink.nla(1, _be32(chain.hook)),
                              netlink.nla(2, struct.pack(">i", chain.priority)))
        messages.append(_msg(NFT_MSG_NEWCHAIN, family, create, name,
                             netlink.nla(3, chain.name.encode() + b"\0"), hook,
                             netlink.nla(7, b"filter\0")))
        for rule in chain.rules:
            exprs = netlink.nested(4, *rule)
            messages.append(_msg(NFT_MSG_NEWRULE, family, create | 0x800,  # NLM_F_APPEND
                                 name, netlink.nla(2, chain.name.encode() + b"\0"), exprs))
    return _batch(*messages)


def add_table(ns: str, table: str, chains: Sequence[Chain], family: int = NFPROTO_BRIDGE) -> float:
    return netlink.send_acked(ns, netlink.NETLINK_NETFILTER, table_batch(table, chains, family),
                              f"add nftables table {table} in {ns}")


def remove_table(ns: str, table: str, family: int = NFPROTO_BRIDGE) -> float:
    message = _msg(NFT_MSG_DELTABLE, family, netlink.NLM_F_ACK, netlink.nla(1, table.encode() + b"\0"))
    return netlink.send_acked(ns, netlink.NETLINK_NETFILTER, _batch(message),
                              f"remove nftables table {table} in {ns}", gone_ok=True)


def tables(ns: str, family: int = NFPROTO_BRIDGE) -> list[str]:
    """Names of the tables of `family` in `ns` (kernel state, for checks and heal)."""
    request = _msg(NFT_MSG_GETTABLE, family, 0x300)  # NLM_F_DUMP
    names = []
    with netlink.translated(f"list nftables tables in {ns}"):
        sock = netlink.namespace_socket(ns, netlink.NETLINK_NETFILTER)
        try:
            sock.sendall(request)
            done = False
            while not done:
                for msg_type, _, _, body in netlink.parse_messages(sock.recv(1 << 16)):
                    if msg_type in (netlink.NLMSG_DONE, netlink.NLMSG_ERROR):
                        done = True
                        break
                    for attr_type, payload in netlink.parse_attrs(body[4:]):
                        if attr_type == 1:
                            names.append(payload.rstrip(b"\0").decode())
        finally:
            sock.close()
    return names


def _undo_nft_table(args: dict[str, Any]) -> None:
    remove_table(args["ns"], args["table"], args["family"])


UNDOS = UndoTable({"nft_table": _undo_nft_table})  # part of `chaos.undo.UNDOS`


def free_table_name(ns: str, prefix: str, family: int) -> str:
    taken = set(tables(ns, family))
    return next(f"{prefix}{n}" for n in range(1, len(taken) + 2) if f"{prefix}{n}" not in taken)


def _host_by_ref(ref: int | str, targets: Sequence[Host], cluster: Sequence[Host]) -> Host:
    if isinstance(ref, int):
        if ref >= len(cluster):
            raise UsageError(f"partition: rank {ref} is not in the cluster ({len(cluster)} hosts known "
                             "to the injector; build it with NetlinkInjector(ledger, hosts=...))")
        return cluster[ref]
    for host in (*cluster, *targets):
        if host.name == ref:
            return host
    raise UsageError(f"partition: no host named {ref!r} in the cluster")


def partition_groups(fault: Partition, targets: Sequence[Host], cluster: Sequence[Host]) -> list[list[Host]]:
    """The groups of hosts the partition separates: its own, or the targets against the rest."""
    if fault.groups is not None:
        return [[_host_by_ref(ref, targets, cluster) for ref in group] for group in fault.groups]
    names = {h.name for h in targets}
    rest = [h for h in cluster if h.name not in names]
    if not targets or not rest:
        raise UsageError("partition without groups cuts the target hosts off from the others: it "
                         "needs the cluster's hosts (NetlinkInjector(ledger, hosts=...)) and targets")
    return [list(targets), rest]


class NftPartition(ClusterMechanism):
    """Drop rules between groups of switch ports, in a bridge-family forward chain."""

    name = "nftables drop rules between groups (switch bridge, forward hook)"

    def apply_cluster(self, fault: FaultBase, targets: Sequence[Host], cluster: Sequence[Host],
                      ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Partition)
        groups = partition_groups(fault, targets, cluster)
        switches = {h.switch_ns for group in groups for h in group}
        if len(switches) != 1:
            raise UnsupportedFault(f"partition: the hosts hang off several switches ({sorted(switches)})")
        rules = []
        for i, senders in enumerate(groups):
            for j, receivers in enumerate(groups):
                if i != j and (fault.direction == "both" or i == 0):
                    rules += [tuple(port_is(a.port, False) + port_is(b.port, True) + drop())
                              for a in senders for b in receivers]
        switch = switches.pop()
        table = free_table_name(switch, "chaos_partition_", NFPROTO_BRIDGE)
        entry = ledger.record("nft_table", ns=switch, table=table, family=NFPROTO_BRIDGE)
        add_table(switch, table, [Chain("forward", BRIDGE_FORWARD, 0, tuple(rules))])
        ledger.mark(entry, "done")
        return [entry]


class NftDrop(Mechanism):
    """Loss or a blackhole without BPF (an ordinary user's user namespace cannot load a
    program): bridge-family rules at the host's switch port drop frames entering from it
    (prerouting) and leaving to it (postrouting), for a loss each with the fault's
    probability drawn per frame. Independent loss only: no correlation, no bursts."""

    name = "nftables drop at the switch port (bridge prerouting/postrouting; a loss draws per frame)"

    def conflict(self, fault: FaultBase, host: Host) -> str | None:
        if isinstance(fault, Loss) and (fault.correlation or fault.burst is not None):
            return ("correlated or bursty loss needs the BPF drop program (root); this fallback draws "
                    "each frame independently: drop correlation and burst, or run as root")
        return None

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, (Loss, Blackhole)) and host.switch_ns and host.port
        match = chance(fault.percent) if isinstance(fault, Loss) else []
        chains = []
        if fault.direction in ("both", "from_host"):
            chains.append(Chain("from_host", BRIDGE_PREROUTING, 0, (tuple(port_is(host.port, False) + match + drop()),)))
        if fault.direction in ("both", "to_host"):
            chains.append(Chain("to_host", BRIDGE_POSTROUTING, 0, (tuple(port_is(host.port, True) + match + drop()),)))
        table = free_table_name(host.switch_ns, f"chaos_drop_{host.port}_", NFPROTO_BRIDGE)
        entry = ledger.record("nft_table", ns=host.switch_ns, table=table, family=NFPROTO_BRIDGE)
        add_table(host.switch_ns, table, chains)
        ledger.mark(entry, "done")
        return [entry]
