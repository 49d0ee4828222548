"""The NFQUEUE delay line: wire delay where the kernel has no sch_netem.

Packets crossing a host's switch port are sent, by an ip-family nftables rule in the
switch namespace (bridge netfilter on, xtables physdev match, NFQUEUE target with
--queue-bypass), to a queue that this module's delayer process listens on:

    python -m chaos.nfq --netns /run/netns/chaos-<run>-sw --queue N --latency 0.05 ...

The delayer holds each packet's verdict until its deadline and then accepts it; it never
sleeps per packet: deadlines wait in a FIFO and one `select` timeout covers the earliest,
and every due packet is released with one batch verdict. A deadline counts from the
kernel's stamp of the packet (NFQA_TIMESTAMP), not from when the delayer read it, and the
timeout aims early by the median of how late its recent timeouts woke it (at most 1 ms):
on an idle 2-core VM each of the two wakes costs 0.2 ms in median and up to 2 ms, which
the delay would otherwise carry. Packets keep their order: a packet's deadline is never
earlier than the one ahead of it, so jitter delays a packet by at least its own draw
(unlike netem's tfifo, which lets a jittered packet overtake).
A delayer that dies leaves the queue without a listener and --queue-bypass lets packets
through undelayed; the kernel never black-holes the link.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import select
import signal
import socket
import statistics
import struct
import sys
import time

from chaos import netem, netlink, nft, proc, topology
from chaos.api import Host
from chaos.faults import Delay, FaultBase
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism, record_process

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 0x1, 0x4
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_TIMESTAMP = 1, 2, 4
NF_ACCEPT = 1
QUEUE_MAXLEN = 1 << 17
DELAYER_NICE = -10  # as the harness's failure detector (harness.job.detector.AHEAD_NICE)
READY = "nfq delayer ready"
BRIDGE_NF_CALL_IPTABLES = "/proc/sys/net/bridge/bridge-nf-call-iptables"


class DelaySampler:
    """Draws per-packet delays: latency + jitter shaped like netem's (same tables)."""

    def __init__(self, latency: float, jitter: float, distribution: str, correlation: float,
                 rng: random.Random | None = None) -> None:
        self.latency, self.jitter, self.correlation = latency, jitter, correlation
        self.table = None if distribution == "uniform" else netem.distribution_table(distribution)
        self.rng = rng or random.Random()
        self._last = self.rng.random()

    def _uniform(self) -> float:
        """A draw in [0, 1) correlated with the previous one as netem's get_crandom does; as
        in netem, correlation narrows the draws, which shifts the mean of a skewed shape."""
        value = self.rng.random()
        if self.correlation:
            value = value * (1 - self.correlation) + self._last * self.correlation
        self._last = value
        return value

    def draw(self) -> float:
        if not self.jitter:
            return self.latency
        u = self._uniform()
        if self.table is None:
            shape = 2 * u - 1
        else:
            shape = self.table[int(u * len(self.table))] / netem.DIST_SCALE
        return max(0.0, self.latency + self.jitter * shape)


def _message(msg_type: int, flags: int, queue: int, attrs: list[bytes]) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + b"".join(attrs)
    return netlink.nlmsg((NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, body)


def _configure(sock: socket.socket, queue: int, attrs: list[bytes]) -> None:
    sock.send(_message(NFQNL_MSG_CONFIG, netlink.NLM_F_REQUEST | netlink.NLM_F_ACK, queue, attrs))
    reply = sock.recv(65536)
    if struct.unpack_from("=IH", reply)[1] == netlink.NLMSG_ERROR:
        code = -struct.unpack_from("=i", reply, 16)[0]
        if code:
            raise OSError(code, f"nfqueue {queue} config: {os.strerror(code)}")


def bind_queue(sock: socket.socket, queue: int) -> None:
    """Make the bound NETLINK_NETFILTER socket `sock` the listener of `queue`."""
    _configure(sock, queue, [netlink.nla(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND, socket.htons(socket.AF_INET)))])
    # Metadata only (no payload copy); GSO packets whole. Fail-open: a queue past its
    # (large) length lets packets through rather than dropping them.
    flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO
    _configure(sock, queue, [netlink.nla(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
                             netlink.nla(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
                             netlink.nla(NFQA_CFG_MASK, struct.pack("!I", flags)),
                             netlink.nla(NFQA_CFG_FLAGS, struct.pack("!I", flags))])


def _packets(buf: bytes) -> list[tuple[int, float | None]]:
    """(packet id, the kernel's wall-clock stamp of it in seconds, if it has one) per
    queued packet in `buf`."""
    packets = []
    for msg_type, _, _, body in netlink.parse_messages(buf):
        if msg_type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            continue
        attrs = dict(netlink.parse_attrs(body[4:]))  # after the nfgenmsg header
        if NFQA_PACKET_HDR not in attrs:
            continue
        stamp = None
        if NFQA_TIMESTAMP in attrs:
            sec, usec = struct.unpack_from("!QQ", attrs[NFQA_TIMESTAMP])
            stamp = sec + usec * 1e-6
        packets.append((struct.unpack_from("!I", attrs[NFQA_PACKET_HDR])[0], stamp))
    return packets


class WakeLateness:
    """How late `select` timeouts wake this process: the median of the last `window`,
    at most `ceiling`. A wake later than that is a stalled or throttled machine, not the
    timer: aiming that far ahead would let packets through undelayed (a 20 ms delay read
    0.66 ms under a 40% CPU quota without the ceiling)."""

    def __init__(self, window: int = 63, ceiling: float = 0.001) -> None:
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.ceiling = ceiling
        self.median = 0.0

    def add(self, late: float) -> None:
        self.recent.append(late)
        self.median = min(self.ceiling, max(0.0, statistics.median(self.recent)))


def queued_at(stamp: float | None, now: float, wall_minus_monotonic: float) -> float:
    """When the kernel queued a packet, on the monotonic clock: its stamp where it has a
    plausible one (a stamp on another clock, or none, reads as `now`)."""
    if stamp is None:
        return now
    queued = stamp - wall_minus_monotonic
    return queued if now - 1.0 <= queued <= now else now


def run_delay_line(sock: socket.socket, queue: int, sampler: DelaySampler) -> int:
    """Hold and release packets until SIGTERM, then release everything held; returns the
    number of packets seen."""
    pending: collections.deque[tuple[float, int]] = collections.deque()
    stopping = False
    seen = 0

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    def accept_up_to(packet_id: int) -> None:
        sock.send(_message(NFQNL_MSG_VERDICT_BATCH, netlink.NLM_F_REQUEST, queue,
                           [netlink.nla(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))]))

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sock.setblocking(False)
    last_deadline = 0.0
    lateness = WakeLateness()
    while not stopping:
        aim = pending[0][0] - lateness.median if pending else None
        timeout = max(0.0, aim - time.monotonic()) if aim is not None else 0.5
        try:
            readable, _, _ = select.select([sock], [], [], timeout)
        except InterruptedError:
            continue
        if not readable and aim is not None and timeout > 0:  # slept until the aim: how late?
            lateness.add(time.monotonic() - aim)
        while readable:
            try:
                buf = sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError as exc:  # ENOBUFS: the kernel dropped queue messages; go on
                print(f"nfq delayer: {exc}", file=sys.stderr, flush=True)
                break
            now = time.monotonic()
            wall_minus_monotonic = time.time() - now
            for packet_id, stamp in _packets(buf):
                last_deadline = max(queued_at(stamp, now, wall_minus_monotonic) + sampler.draw(), last_deadline)
                pending.append((last_deadline, packet_id))
                seen += 1
        release_by = time.monotonic() + lateness.median  # as the timeout aimed
        due = None
        while pending and pending[0][0] <= release_by:
            due = pending.popleft()[1]
        if due is not None:
            accept_up_to(due)  # ids rise in queue order: one batch verdict releases them all
    if pending:
        accept_up_to(pending[-1][1])
    return seen


class NfqueueDelay(Mechanism):
    """A delayer process per delayed link, fed by an ip-family table in the switch."""

    name = "NFQUEUE delay line in the switch namespace (bridge netfilter + physdev, queue-bypass)"
    ready_timeout_s = 10.0

    @staticmethod
    def table(host: Host) -> str:
        return f"chaos_delay_{host.port}"

    def conflict(self, fault: FaultBase, host: Host) -> str | None:
        if self.table(host) in nft.tables(host.switch_ns, nft.NFPROTO_IPV4):
            return (f"{host.name}'s link already carries a delay; a second delay line would only "
                    "see what the first lets through. Revert it first, or give one delay")
        return None

    @staticmethod
    def chains(fault: Delay, host: Host, queue: int) -> list[nft.Chain]:
        forward, local_in = [], []
        if fault.direction in ("both", "from_host"):
            rule = tuple(nft.physdev_is(host.port, outgoing=False) + nft.nfqueue(queue))
            forward.append(rule)
            local_in.append(rule)  # to the switch itself (the control plane)
        if fault.direction in ("both", "to_host"):
            forward.append(tuple(nft.physdev_is(host.port, outgoing=True) + nft.nfqueue(queue)))
        chains = [nft.Chain("forward", nft.IP_FORWARD, 0, tuple(forward))]
        if local_in:
            chains.append(nft.Chain("input", nft.IP_LOCAL_IN, 0, tuple(local_in)))
        return chains

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Delay)
        queue = netlink.ifindex(host.switch_ns, host.port)  # unique per switch namespace
        # The pid is known only once it runs: heal also finds delayers by their --run-id.
        helper = proc.spawn_helper(
            "chaos.nfq", "--netns", topology.namespace_path(host.switch_ns), "--queue", str(queue),
            "--latency", repr(fault.latency), "--jitter", repr(fault.jitter),
            "--distribution", fault.distribution, "--correlation", repr(fault.correlation),
            "--run-id", ledger.run_id)
        proc.wait_ready(helper, READY, self.ready_timeout_s)
        entries = [record_process(ledger, helper.pid, "stop_process")]
        table = ledger.record("nft_table", ns=host.switch_ns, table=self.table(host), family=nft.NFPROTO_IPV4)
        entries.append(table)
        nft.add_table(host.switch_ns, self.table(host), self.chains(fault, host, queue), nft.NFPROTO_IPV4)
        ledger.mark(table, "done")
        return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.nfq", description=__doc__.split("\n\n")[0])
    parser.add_argument("--netns", required=True, help="path of the switch's network namespace")
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--latency", type=float, required=True, help="seconds")
    parser.add_argument("--jitter", type=float, default=0.0, help="seconds")
    parser.add_argument("--distribution", default="uniform", choices=netem.DISTRIBUTIONS)
    parser.add_argument("--correlation", type=float, default=0.0, help="fraction 0..1")
    parser.add_argument("--run-id", required=True, help="the run this delayer belongs to (for heal)")
    args = parser.parse_args(argv)
    proc.enter_netns(args.netns)
    with open(BRIDGE_NF_CALL_IPTABLES, "w") as knob:  # bridged packets see ip-family hooks
        knob.write("1")
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netlink.NETLINK_NETFILTER)
    netlink.set_buffer(sock, 64 << 20)  # bursts of packet messages
    sock.bind((0, 0))
    bind_queue(sock, args.queue)
    # A socket asking for receive stamps makes the kernel stamp every packet as it arrives
    # (one machine-wide switch), so queued packets carry NFQA_TIMESTAMP.
    stamps_on = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stamps_on.setsockopt(socket.SOL_SOCKET, netlink.SO_TIMESTAMPNS, 1)
    with contextlib.suppress(PermissionError):  # beside busy ranks, a late release is a longer delay
        os.setpriority(os.PRIO_PROCESS, 0, DELAYER_NICE)
    sampler = DelaySampler(args.latency, args.jitter, args.distribution, args.correlation)
    print(f"{READY} pid={os.getpid()} queue={args.queue}", flush=True)
    sys.stdout = open(os.devnull, "w")  # the harness stops reading; it may be dead
    run_delay_line(sock, args.queue, sampler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
