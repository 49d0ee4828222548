"""Fidelity of the fault mechanisms: configured against measured, between two real hosts.

`chaos calibrate` builds a scratch cluster (a switch and two hosts, laid out as a run's by
`chaos.topology`, named ``chaos-cal<pid>-*``, every namespace in a ledger so a heal removes
them), applies each fault with the mechanism this machine picks, measures it with small
pure-Python UDP/TCP traffic between the two hosts only, and prints configured vs
measured against the targets: loss within 2 points, over as many datagrams as measure it
as precisely as 5,000 independent ones; median one-way delay within 1 ms, and a jitter's
deviation within 10%; duplicates, corrupted datagrams and reordered ones (sent at once
rather than after the latency) within 2 points of 5,000; link down (and blackhole,
partition) effective within 10 ms of the apply; bandwidth within 10%, as frames on the
wire of datagrams offered faster than the cap (one TCP stream's payload rate is shown
beside it, not judged). A kind this machine cannot inject is said (n/a), not measured.
The storage kinds (chaos.calibrate_storage) and `slow` (chaos.calibrate_slow) are families
of their own, each on its own scratch setting (chaos.fidelity), made only when asked for.

The traffic helpers are also what the tests measure with. Sockets are opened inside a
host's namespace once and used from this process; both hosts share this machine's
clocks, so one-way delay is measured directly, from the send to the kernel's arrival stamp.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import socket
import statistics
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence


from chaos import netlink, topology, units, userns
from chaos.bpf import DropChain
from chaos.api import Host, Injection
from chaos.errors import ChaosError
from chaos.faults import Bandwidth, Corrupt, Delay, Duplicate, FaultBase, Loss, Reorder, parse_fault
from chaos.inject import NetlinkInjector
from chaos.calibrate_slow import SLOW
from chaos.calibrate_storage import STORAGE
from chaos.fidelity import Family, Figure, not_measured, owned
from chaos.ledger import Ledger

PORT = 47000
IP_MTU = 14
UDP_IP_HEADERS, ETHERNET_HEADER = 8 + 20, 14
_TIMESPEC = struct.Struct("=qq")
_STAMP = struct.Struct("=IId")  # stream tag, sequence number, monotonic send time
_CHECK = struct.Struct("=I")  # crc32 of the rest: veth hands a corrupted datagram up unchecked
# Padding makes the UDP checksum field, the one place a flipped bit goes unseen, under 1%
# of the bytes a corruption can hit.
_DATAGRAM = 256


# --- a scratch cluster -----------------------------------------------------------------------

@contextlib.contextmanager
def scratch_cluster(run_id: str, ledger: Ledger, hosts: int = 2,
                    settings: dict[str, str] | None = None) -> Iterator[tuple[Host, ...]]:
    """`hosts` hosts on one switch, laid out as a run's (`chaos.topology`), each with the
    network `settings` (chaos.sysctl); removed on the way out.
    The ledger names this process as the owner first: a concurrent `chaos run`'s heal leaves
    the cluster alone while it measures."""
    with owned(ledger):
        cluster = topology.hosts_of(run_id, hosts)
        topology.build(ledger, cluster, settings)
        yield cluster


# --- traffic ---------------------------------------------------------------------------------

def host_socket(host: Host, kind: int) -> socket.socket:
    """A socket living in `host`'s namespace."""
    with netlink.translated(f"open a socket in {host.name}"):
        return netlink.socket_in(host.ns_path, socket.AF_INET, kind)


@dataclass
class Received:
    """What a receiver saw: per sequence number, send and receive times (the first copy's),
    the extra copies, and the datagrams that arrived damaged (tag or sequence unreadable)."""

    sent_at: dict[int, float]
    received_at: dict[int, float]
    copies: int = 0
    damaged: int = 0
    order: list[int] = field(default_factory=list)  # sequence numbers as the receiver read them

    def delays(self) -> list[float]:
        return [self.received_at[s] - self.sent_at[s] for s in self.received_at]

    def overtaking(self) -> int:
        """Datagrams read after one sent behind them: they were overtaken."""
        highest, count = -1, 0
        for seq in self.order:
            count += seq < highest
            highest = max(highest, seq)
        return count


def _datagram(tag: int, seq: int, sent: float) -> bytes:
    body = _STAMP.pack(tag, seq, sent).ljust(_DATAGRAM - _CHECK.size, b"\0")
    return body + _CHECK.pack(zlib.crc32(body))


def _intact(data: bytes) -> bool:
    return len(data) == _DATAGRAM and _CHECK.unpack_from(data, _DATAGRAM - _CHECK.size)[0] == \
        zlib.crc32(data[:-_CHECK.size])


def _wall_stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, netlink.SO_TIMESTAMPNS):
            sec, nsec = _TIMESPEC.unpack_from(data)
            return sec + nsec * 1e-9
    return None


def wall_minus_monotonic() -> float:
    """time.time() - time.monotonic(), from the pair of reads least apart of five: a read
    pair split by a preemption (frequent in User-Mode Linux) would shift every arrival."""
    pairs = []
    for _ in range(5):
        before, wall, after = time.monotonic(), time.time(), time.monotonic()
        pairs.append((after - before, wall - (before + after) / 2))
    return min(pairs)[1]


def _arrival(ancillary: list[tuple[int, int, bytes]], offset: float) -> float:
    """When the kernel received a datagram, on the monotonic clock (the receiving thread
    may wake a millisecond later on a busy or idle VM); `offset`: wall_minus_monotonic()."""
    stamp = _wall_stamp(ancillary)
    return time.monotonic() if stamp is None else stamp - offset


@contextlib.contextmanager
def udp_stream(sender: Host, receiver: Host, port: int = PORT) -> Iterator[Callable[[int, float], Received]]:
    """Yields send(count, interval_s) -> Received: numbered, timestamped datagrams from
    `sender` to `receiver`, paced, collected by a thread until 0.5 s after the last."""
    rx = host_socket(receiver, socket.SOCK_DGRAM)
    tx = host_socket(sender, socket.SOCK_DGRAM)
    netlink.set_buffer(rx, 32 << 20)
    rx.setsockopt(socket.SOL_SOCKET, netlink.SO_TIMESTAMPNS, 1)
    rx.bind((receiver.address, port))
    rx.settimeout(0.5)

    def send(count: int, interval_s: float) -> Received:
        result = Received({}, {})
        done = threading.Event()
        tag = random.getrandbits(32)  # datagrams held back from an earlier stream are not counted
        offset = wall_minus_monotonic()

        def collect() -> None:
            while True:
                try:
                    data, ancillary, _, _ = rx.recvmsg(_DATAGRAM + 1, socket.CMSG_SPACE(_TIMESPEC.size))
                except socket.timeout:
                    if done.is_set():
                        return
                    continue
                if not _intact(data):
                    result.damaged += 1
                    continue
                got_tag, seq, _ = _STAMP.unpack_from(data)
                if got_tag != tag:
                    continue
                if seq in result.received_at:
                    result.copies += 1
                else:
                    result.received_at[seq] = _arrival(ancillary, offset)
                    result.order.append(seq)

        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        start = time.monotonic()
        for seq in range(count):
            target = start + seq * interval_s
            while (now := time.monotonic()) < target:
                time.sleep(min(target - now, 0.001))
            result.sent_at[seq] = time.monotonic()
            with contextlib.suppress(OSError):  # a link that is down refuses sends: a loss
                tx.sendto(_datagram(tag, seq, result.sent_at[seq]), (receiver.address, port))
        done.set()
        thread.join()
        return result

    try:
        send(1, 0)  # resolve ARP before measuring
        yield send
    finally:
        rx.close()
        tx.close()


def delivered(sender: Host, receiver: Host, count: int = 200, interval_s: float = 0.0005) -> float:
    """Fraction of `count` datagrams from `sender` that reached `receiver`."""
    with udp_stream(sender, receiver) as send:
        return len(send(count, interval_s).received_at) / count


def tcp_throughput(sender: Host, receiver: Host, seconds: float, port: int = PORT + 1) -> float:
    """Bits per second of one TCP stream from `sender` to `receiver`, measured at the receiver
    over `seconds` after a 0.3 s ramp."""
    server = host_socket(receiver, socket.SOCK_STREAM)
    client = host_socket(sender, socket.SOCK_STREAM)
    try:
        # the previous measurement's connection may still be in TIME_WAIT on this port
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((receiver.address, port))
        server.listen(1)
        client.connect((receiver.address, port))
        conn, _ = server.accept()
        conn.settimeout(2.0)
        stop = threading.Event()

        def pump() -> None:
            chunk = b"\0" * 65536
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    client.sendall(chunk)

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        ramp_end = time.monotonic() + 0.3
        while time.monotonic() < ramp_end:
            conn.recv(1 << 20)
        received, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            received += len(conn.recv(1 << 20))
        elapsed = time.monotonic() - start
        stop.set()
        client.shutdown(socket.SHUT_RDWR)
        conn.close()
        thread.join()
        return received * 8 / elapsed
    finally:
        client.close()
        server.close()


def udp_cap(sender: Host, receiver: Host, rate_bits: float, seconds: float, port: int = PORT + 2) -> float:
    """Bits per second on the wire (Ethernet frames, as tbf counts them) that reach
    `receiver` of full-sized datagrams offered from `sender` at 1.5 times `rate_bits`: the
    cap itself, with no congestion control in the way. Counted by the kernel's arrival
    stamps over `seconds`, after a 0.3 s ramp that fills the cap's queue."""
    rx = host_socket(receiver, socket.SOCK_DGRAM)
    tx = host_socket(sender, socket.SOCK_DGRAM)
    try:
        netlink.set_buffer(rx, 64 << 20)
        rx.setsockopt(socket.SOL_SOCKET, netlink.SO_TIMESTAMPNS, 1)
        rx.bind((receiver.address, port))
        rx.settimeout(0.5)
        tx.connect((receiver.address, port))
        payload = tx.getsockopt(socket.IPPROTO_IP, IP_MTU) - UDP_IP_HEADERS
        frame_bits = (payload + UDP_IP_HEADERS + ETHERNET_HEADER) * 8
        arrivals: list[float] = []
        done = threading.Event()

        def collect() -> None:
            while True:
                try:
                    _, ancillary, _, _ = rx.recvmsg(payload, socket.CMSG_SPACE(_TIMESPEC.size))
                except socket.timeout:
                    if done.is_set():
                        return
                    continue
                if (stamp := _wall_stamp(ancillary)) is not None:
                    arrivals.append(stamp)

        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        datagram = b"\0" * payload
        per_ms = 1.5 * rate_bits / frame_bits / 1000
        start, sent = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < 0.3 + seconds:
            while sent < per_ms * elapsed * 1000:
                with contextlib.suppress(OSError):  # ENOBUFS: the cap's queue is full, a drop
                    tx.send(datagram)
                sent += 1
            time.sleep(0.001)
        done.set()
        thread.join()
    finally:
        rx.close()
        tx.close()
    if len(arrivals) < 2:
        raise ChaosError(f"{len(arrivals)} of {sent} datagrams from {sender.name} reached {receiver.name}")
    first = arrivals[0] + 0.3
    window = [t for t in arrivals if t >= first]
    if len(window) < 2:
        raise ChaosError(f"no datagram from {sender.name} reached {receiver.name} after the 0.3 s ramp")
    return (len(window) - 1) * frame_bits / (window[-1] - window[0])


def cut_after_apply(sender: Host, receiver: Host, apply: Callable[[], Injection]) -> tuple[float, Injection]:
    """Stream a datagram every 0.5 ms, apply a cutting fault mid-stream; returns how long
    after the kernel acknowledged the apply packets still got through (<= 0: at once)."""
    with udp_stream(sender, receiver) as send:
        holder: dict[str, Injection] = {}

        def apply_midway() -> None:
            time.sleep(0.1)
            holder["injection"] = apply()

        thread = threading.Thread(target=apply_midway)
        thread.start()
        result = send(600, 0.0005)
        thread.join()
    injection = holder["injection"]
    last_through = max(result.sent_at[s] for s in result.received_at)
    return last_through - injection.applied.t_applied, injection


def loss_sample_size(fault: Loss) -> int:
    """Datagrams that measure `fault`'s loss as precisely as 5,000 independent ones: losses
    in bursts or correlated are not independent, and the loss of a sample of n varies
    (1 + r) / (1 - r) times as much, r being the drop chain's lag-one correlation (5% in
    bursts of 3: 4.7 times, 23,500 datagrams; 5,000 of them read 3.8-6.2% in 17 runs)."""
    chain = DropChain.from_loss(fault.percent, fault.correlation, fault.burst)
    r = 1.0 - chain.enter - chain.leave
    return int(math.ceil(5000 * (1 + r) / (1 - r) / 500) * 500)


# --- calibration -----------------------------------------------------------------------------


def _streamed(injector: NetlinkInjector, fault: FaultBase, a: Host, b: Host, count: int,
              interval_s: float) -> Received:
    injection = injector.apply(fault, [a])
    try:
        with udp_stream(a, b) as send:
            return send(count, interval_s)
    finally:
        injection.revert()


def _within_2_points(measured: float, configured: float, count: int, what: str) -> tuple[str, bool]:
    return f"{measured:.1%} of {count} {what}", abs(measured - configured) <= 0.02


def _delay(fault: Delay, got: Received) -> tuple[str, bool]:
    """Median one-way within 1 ms; with a jitter, the deviation within 10% of the shape's
    (uniform over +/- jitter: jitter / sqrt(3); the tables: jitter)."""
    delays = got.delays()
    median = statistics.median(delays)
    measured, ok = f"{median * 1000:.2f} ms median one-way", abs(median - fault.latency) <= 0.001
    if fault.jitter:
        spread = statistics.pstdev(delays)
        expected = fault.jitter / math.sqrt(3) if fault.distribution == "uniform" else fault.jitter
        measured += f", deviation {spread * 1000:.2f} ms (expected {expected * 1000:.2f})"
        ok = ok and abs(spread - expected) <= 0.1 * expected
    return measured, ok


def _measure(setting: tuple[NetlinkInjector, Sequence[Host]], spec: dict) -> Figure:
    injector, hosts = setting
    a, b = hosts[0], hosts[1]
    fault: FaultBase = parse_fault(spec)
    mechanism = injector.mechanism(fault)
    refused = not_measured(injector, fault, a)  # a fallback's limit: said, not measured
    if refused:
        return refused
    if isinstance(fault, Loss):
        count = loss_sample_size(fault)
        got = _streamed(injector, fault, a, b, count, 0.0002)
        measured, ok = _within_2_points(1 - len(got.received_at) / count, fault.percent, count, "lost")
        return Figure(fault.describe(), mechanism, spec["percent"], measured, ok)
    if isinstance(fault, Delay):
        # with a jitter, datagrams 4 deviations apart: order is kept (a datagram waits for
        # the one ahead of it), so closer ones would narrow the shape measured
        got = _streamed(injector, fault, a, b, 500 if fault.jitter else 1000, max(0.002, 4 * fault.jitter))
        measured, ok = _delay(fault, got)
        return Figure(fault.describe(), mechanism, spec["latency"], measured, ok)
    if isinstance(fault, (Duplicate, Corrupt)):
        got = _streamed(injector, fault, a, b, 5000, 0.0005)
        if isinstance(fault, Duplicate):
            measured, ok = _within_2_points(got.copies / 5000, fault.percent, 5000, "arrived twice")
        else:  # a flipped bit: dropped by a header check, or delivered with a bad crc32
            measured, ok = _within_2_points(1 - len(got.received_at) / 5000, fault.percent, 5000,
                                            f"not intact ({got.damaged} delivered damaged)")
        return Figure(fault.describe(), mechanism, spec["percent"], measured, ok)
    if isinstance(fault, Reorder):
        got = _streamed(injector, fault, a, b, 5000, 0.0005)
        ahead = sum(d < fault.latency / 2 for d in got.delays()) / 5000
        measured, ok = _within_2_points(ahead, fault.percent, 5000, f"went at once, not after "
                                        f"{units.format_duration(fault.latency)} ({len(got.received_at)} arrived)")
        return Figure(fault.describe(), mechanism, spec["percent"], measured, ok)
    if isinstance(fault, Bandwidth):
        # Judged on the cap itself; one TCP stream's payload is shown beside it, as a job would
        # see it: a few percent of headers below the cap, and far below it where a loss at the
        # full queue costs a retransmission timeout (docs/performance.md).
        injection = injector.apply(fault, [a])
        cap = udp_cap(a, b, fault.rate, 2.0)
        tcp = tcp_throughput(a, b, 2.0)
        injection.revert()
        return Figure(fault.describe(), mechanism, spec["rate"],
                      f"{cap / 1e6:.2f} Mbit/s of frames (datagrams offered at 1.5 times the rate); "
                      f"one TCP stream {tcp / 1e6:.2f} Mbit/s of payload",
                      abs(cap - fault.rate) <= 0.1 * fault.rate)
    lag, injection = cut_after_apply(a, b, lambda: injector.apply(fault, [a]))
    injection.revert()
    restored = delivered(a, b)
    return Figure(fault.describe(), mechanism, "cut at apply, restored at revert",
                  f"last packet through {lag * 1000:+.1f} ms after apply; {restored:.0%} after revert",
                  lag <= 0.010 and restored == 1.0)


@contextlib.contextmanager
def _network(run_id: str, ledger: Ledger) -> Iterator[tuple[NetlinkInjector, Sequence[Host]]]:
    with scratch_cluster(run_id, ledger) as hosts:
        yield NetlinkInjector(ledger, hosts=hosts), hosts


NETWORK = Family(specs=(
    {"kind": "loss", "percent": "20%", "direction": "from_host"},
    {"kind": "loss", "percent": "5%", "burst": 3, "direction": "from_host"},
    {"kind": "delay", "latency": "20ms", "direction": "from_host"},
    {"kind": "delay", "latency": "50ms", "direction": "both"},
    {"kind": "delay", "latency": "10ms", "jitter": "2ms", "distribution": "normal", "direction": "from_host"},
    {"kind": "bandwidth", "rate": "10mbit"},
    {"kind": "bandwidth", "rate": "100mbit"},
    {"kind": "duplicate", "percent": "10%", "direction": "from_host"},
    {"kind": "corrupt", "percent": "10%", "direction": "from_host"},
    {"kind": "reorder", "percent": "25%", "latency": "10ms", "direction": "from_host"},
    {"kind": "link_down"},
    {"kind": "blackhole"},
    {"kind": "partition", "groups": [[0], [1]]},
), scratch=_network, measure=_measure)
# Each family's scratch setting is made only when one of its kinds is asked for.
FAMILIES = (NETWORK, STORAGE, SLOW)
CALIBRATIONS = tuple(spec for family in FAMILIES for spec in family.specs)
CALIBRATED_KINDS = tuple(kind for family in FAMILIES for kind in family.kinds)


def calibrate(run_id: str, ledger: Ledger, kinds: Sequence[str] = CALIBRATED_KINDS) -> list[Figure]:
    figures = []
    for family in FAMILIES:
        specs = [spec for spec in family.specs if spec["kind"] in kinds]
        if specs:
            with family.scratch(run_id, ledger) as setting:
                figures += [family.measure(setting, spec) for spec in specs]
    return figures


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", action="append", choices=CALIBRATED_KINDS,
                        help="calibrate this fault kind only (repeatable; default: every kind)")


def calibrate_command(args: argparse.Namespace) -> int:
    """`chaos calibrate`: configured vs measured for each mechanism; exit 1 if one misses
    (a kind this machine cannot inject is said, not a miss)."""
    run_id = f"cal{os.getpid()}"
    try:
        figures = calibrate(run_id, Ledger(run_id), args.kind or CALIBRATED_KINDS)
    except (ChaosError, OSError) as exc:  # OSError: a measurement socket between the scratch hosts
        print(f"chaos calibrate: {exc}", file=sys.stderr)
        return 1
    finally:  # an ordinary user's, where no kind asked for built a namespace
        userns.remove_empty_pin_folder(userns.netns_dir())
    for f in figures:
        print(f"{ {True: 'ok  ', False: 'MISS', None: 'n/a '}[f.ok]} {f.fault}\n     configured {f.configured}; measured {f.measured}\n"
              f"     via {f.mechanism}")
    return 0 if False not in (f.ok for f in figures) else 1


def calibrate_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos calibrate", description=calibrate_command.__doc__)
    add_calibrate_arguments(parser)
    return calibrate_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(calibrate_main())
