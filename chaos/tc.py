"""Traffic-control mechanisms: netem and tbf qdiscs, cls_bpf drop filters.

Where each acts (wire semantics): a link's "to_host" way is the egress of
its switch-side port; its "from_host" way is the ingress of that port for filters (clsact),
and, for qdiscs that only exist on egress (netem, tbf), the egress of the host's own eth0,
the sender's side of the wire as on a real slower NIC.

Composition: drop filters compose (every filter on a hook runs, each may drop: two losses
of p and q drop 1-(1-p)(1-q), a blackhole drops all). A link carries at most one root
qdisc of ours; a second qdisc fault on the same way is refused (FaultConflict).
"""
from __future__ import annotations

import os
import struct
from typing import Any

from chaos import bpf, netem, netlink
from chaos.api import Host
from chaos.bpf import DropChain
from chaos.faults import Bandwidth, Blackhole, FaultBase, LinkDown, LinkFault, Loss
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable

RTM_NEWQDISC = 36
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_TBF_PARMS, TCA_TBF_RATE64, TCA_TBF_BURST = 1, 4, 6
TC_LINKLAYER_ETHERNET = 1
TBF_QUEUE_S = 0.05  # tbf's queue holds this long at the rate (tc's "latency 50ms")
DEFAULT_BURST_S = 0.004
MIN_BURST = 16 * 1024
FILTER_NAME = "chaos_drop"


def _sides(fault: LinkFault, host: Host) -> list[tuple[str, str, str]]:
    """(namespace, device, clsact hook) for each way of the link the fault degrades."""
    sides = []
    if fault.direction in ("both", "to_host"):
        sides.append((host.switch_ns, host.port, "egress"))
    if fault.direction in ("both", "from_host"):
        sides.append((host.switch_ns, host.port, "ingress"))
    return sides


def _qdisc_sides(fault: LinkFault, host: Host) -> list[tuple[str, str]]:
    """(namespace, device) whose root qdisc carries each way (egress only exists for qdiscs)."""
    sides = []
    if fault.direction in ("both", "to_host"):
        sides.append((host.switch_ns, host.port))
    if fault.direction in ("both", "from_host"):
        sides.append((host.ns_path, host.ifname))
    return sides


# --- qdiscs -------------------------------------------------------------------------------

def qdisc_message(ifindex: int, kind: str, options: bytes) -> bytes:
    """RTM_NEWQDISC for a root qdisc, created exclusively (an existing one is not replaced)."""
    tcmsg = struct.pack("=BxxxiIII", 0, ifindex, 0, netlink.TC_H_ROOT, 0)
    body = tcmsg + netlink.nla(TCA_KIND, kind.encode() + b"\0") + netlink.nla(TCA_OPTIONS, options)
    flags = netlink.NLM_F_REQUEST | netlink.NLM_F_ACK | netlink.NLM_F_CREATE | netlink.NLM_F_EXCL
    return netlink.nlmsg(RTM_NEWQDISC, flags, body)


def tbf_sizes(rate_bits: float, burst: int | None) -> tuple[int, int, int]:
    """(rate in bytes/s, burst in bytes, queue limit in bytes) of the tbf that caps at
    `rate_bits`: the burst given or DEFAULT_BURST_S at the rate, a queue of TBF_QUEUE_S."""
    rate = int(rate_bits / 8)
    burst = burst or max(MIN_BURST, int(rate * DEFAULT_BURST_S))
    return rate, burst, int(rate * TBF_QUEUE_S) + burst


def tbf_options(rate_bits: float, burst: int | None) -> bytes:
    """tbf with a 64-bit rate where needed, the burst in bytes (TCA_TBF_BURST) and a queue
    of TBF_QUEUE_S at the rate; no rate table (the kernel computes it)."""
    rate, burst, limit = tbf_sizes(rate_bits, burst)
    buffer_ticks = min(int(burst / rate * 1e9) >> 6, 0xFFFFFFFF)
    ratespec = struct.pack("=BBHhHI", 0, TC_LINKLAYER_ETHERNET, 0, 0, 0, min(rate, 0xFFFFFFFF))
    qopt = ratespec + struct.pack("=BBHhHI", 0, 0, 0, 0, 0, 0) + struct.pack("=III", limit, buffer_ticks, 0)
    attrs = netlink.nla(TCA_TBF_PARMS, qopt) + netlink.nla(TCA_TBF_BURST, struct.pack("=I", burst))
    if rate > 0xFFFFFFFF:
        attrs += netlink.nla(TCA_TBF_RATE64, struct.pack("=Q", rate))
    return attrs


def _undo_root_qdisc(args: dict[str, Any]) -> None:
    netlink.remove_root_qdisc(args["ns"], args["ifname"], args["kind"])


class RootQdisc(Mechanism):
    """A root qdisc of `kind` on each way the fault degrades."""

    kind: str

    def options(self, fault: FaultBase) -> bytes:
        raise NotImplementedError

    def conflict(self, fault: FaultBase, host: Host) -> str | None:
        for ns, ifname in _qdisc_sides(fault, host):  # type: ignore[arg-type]
            for qdisc in netlink.qdiscs(ns, ifname):
                if qdisc["parent"] == netlink.TC_H_ROOT and qdisc["kind"] in ("netem", "tbf"):
                    return (f"{host.name}'s link already carries a {qdisc['kind']} qdisc on {ifname}; "
                            f"a {self.kind} for {fault.kind} would replace it. Revert that fault first")  # type: ignore[attr-defined]
        return None

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        options = self.options(fault)
        entries = []
        for ns, ifname in _qdisc_sides(fault, host):  # type: ignore[arg-type]
            message = qdisc_message(netlink.ifindex(ns, ifname), self.kind, options)
            entry = ledger.record("root_qdisc", ns=ns, ifname=ifname, kind=self.kind)
            entries.append(entry)
            netlink.send_acked(ns, netlink.NETLINK_ROUTE, [message], f"add {self.kind} to {ifname} in {ns}")
            ledger.mark(entry, "done")
        return entries


class NetemQdisc(RootQdisc):
    name = "netem qdisc (switch port egress / host eth0 egress)"
    kind = "netem"

    def options(self, fault: FaultBase) -> bytes:
        return netem.options(fault)


class TbfBandwidth(RootQdisc):
    name = "tbf qdisc (switch port egress / host eth0 egress)"
    kind = "tbf"

    def options(self, fault: FaultBase) -> bytes:
        assert isinstance(fault, Bandwidth)
        return tbf_options(fault.rate, fault.burst)


# --- cls_bpf drop filters -------------------------------------------------------------------

def _undo_clsact(args: dict[str, Any]) -> None:
    netlink.remove_clsact_if_unused(args["ns"], args["ifname"])


def _undo_bpf_filter(args: dict[str, Any]) -> None:
    netlink.remove_filter(args["ns"], args["ifname"], args["hook"], args["prio"])


# The ledger ops of this module's mechanisms (part of `chaos.undo.UNDOS`).
UNDOS = UndoTable({"root_qdisc": _undo_root_qdisc, "clsact": _undo_clsact, "bpf_filter": _undo_bpf_filter})


class BpfDrop(Mechanism):
    """A cls_bpf program at the switch port's clsact hooks that drops with the fault's chain.
    `own_interface`: the hooks are on the host's own interface (a Slurm node's agent), whose
    outgoing packets are dropped as lost on the wire, not as refused by its own qdisc
    (chaos.bpf: TC_ACT_STOLEN)."""

    def __init__(self, own_interface: bool = False) -> None:
        self.own_interface = own_interface
        self.name = ("tc clsact + cls_bpf drop program (" + ("the node's own interface" if own_interface
                                                            else "switch port") + ")")

    def chain(self, fault: FaultBase) -> DropChain:
        if isinstance(fault, Loss):
            return DropChain.from_loss(fault.percent, fault.correlation, fault.burst)
        assert isinstance(fault, (Blackhole, LinkDown))  # a link down from the node's side: its carrier lost
        return DropChain.from_loss(1.0)

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        chain = self.chain(fault)
        entries = []
        for ns, ifname, hook in _sides(fault, host):  # type: ignore[arg-type]
            clsact = ledger.record("clsact", ns=ns, ifname=ifname)
            entries.append(clsact)
            netlink.add_clsact(ns, ifname)
            ledger.mark(clsact, "done")
            prio = 1 + max(netlink.filter_prios(ns, ifname, hook), default=0)
            outgoing = self.own_interface and hook == "egress"
            fd = bpf.load_drop_program(chain, FILTER_NAME, bpf.TC_ACT_STOLEN if outgoing else bpf.TC_ACT_SHOT)
            try:
                entry = ledger.record("bpf_filter", ns=ns, ifname=ifname, hook=hook, prio=prio)
                entries.append(entry)
                netlink.add_bpf_filter(ns, ifname, hook, prio, fd, FILTER_NAME)
                ledger.mark(entry, "done")
            finally:
                os.close(fd)  # the attached filter holds the program
        return entries
