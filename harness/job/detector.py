"""A failure detector that does not wait for the collective timeout.

Heartbeats travel on a side channel of the control plane, not through the gloo ring:

    rank --UDP "hi <rank>" until its first digest--------------->
    rank's heart --UDP "hb <rank> <seq> <gen>" every interval-->  HeartbeatServer (control
    rank --TCP lease ("<rank> <floor>", then held open)------->   process, switch namespace,
    rank <--UDP digest every TICK_S, and at once when a lease closes--  store port + 1)

The heart (`harness.job.heart`) is a child process of the rank that sends on the rank's
own UDP socket, so its beats never wait for the rank's GIL.

The server timestamps arrivals on its own clock and sends every rank the same digest: per
rank, seconds since its last heartbeat, phi (accrual suspicion), whether its lease closed
(the process is gone: the kernel closed its socket), its generation, and its recent
heartbeat loss; and how many times a rank left out has asked to rejoin. Every rank judges
the same digest, so survivors agree on who is suspect within one digest.

The digest is binary, in columns (`encode_digest`), and lists only the ranks with
something to tell: every rank's silence below the floor its lease announced (the least
silence the rank's judgements read: `floor_for`) would change no verdict, so a digest
says of such a rank only that it is "fresh". With every rank beating, a digest is its
header, whatever the ranks; before, it carried every rank's 17 bytes to every rank, 20
times a second: 357 MB/s at 1024 ranks (docs/scale-journal.md).

A fault on a rank's link cuts its heartbeats as well as its gloo
traffic; the rank itself notices that digests stopped (it is the one cut off).

UDP on purpose: under 20% loss a TCP heartbeat stream stalls behind retransmissions (RTO
doubling), while independent datagrams keep arriving: a lossy rank looks slow (a
straggler), not dead. Silence is measured only after draining the socket (server and
rank), so a starved reader never blames a peer for its own delay.

Neither side counts silence over a stall of its own (`Stalls`: a thread of it woke late):
when the whole machine stops, the hearts stop too, and a stop is not a failure.

`PhiAccrual` and `FailureDetector.judge` are pure (a clock is passed in) and unit-tested
with fake clocks; the sockets are the edge.
"""
from __future__ import annotations

import array
import collections
import math
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, NamedTuple

TICK_S = 0.05             # how often the server sends its digest
DEAF_AFTER_S = 2 * TICK_S  # no heartbeat from any rank this long (at least): the server is cut off
ASKS_POLL_S = TICK_S / 2  # how often it reads the store's rejoin request count
LOSS_WINDOW_S = 2.0       # heartbeat loss is measured over this recent window
PHI_WINDOW = 100          # arrival intervals kept per rank for phi
PHI_MIN_STD_S = 0.05      # floor on the interval spread: a perfectly regular sender is not fragile
LEASE_CONNECT_TIMEOUT_S = 2.0
HEART_STOP_S = 2.0        # a heart ends within one heartbeat of end of file on its pipe
SERVER_STOP_S = 2.0       # the server's threads end within a tick, or a store call, of being told
DATAGRAM_MAX = 65507
# While the server sends a digest to every rank it reads heartbeats every so many sends:
# sending 1024 ranks their 17 kB digests took long enough for the heartbeats meanwhile to
# overflow the socket's buffer, always the same ranks' (bench/control_plane.py).
DRAIN_EVERY = 32
# The server's heartbeat socket holds this much (the kernel's default, 208 kB, is about 200
# heartbeats: 10 ms of 1024 ranks'), for when its thread is not scheduled for a while.
RECEIVE_BUFFER = 8 << 20
SO_RCVBUFFORCE = 33  # <asm-generic/socket.h>; Python's socket module does not name it
# The control plane and each rank's heart stand for timing that, on a real cluster, has
# cores of its own. Here they share two with 16-64 busy ranks: at 64 ranks beside two CPU
# hogs, at nice 0 the control plane made 817 false suspicions in 681 s and the ranks'
# heartbeat threads 204 in 901 s; with both at -10, none in 701 s (docs/scale-journal.md).
AHEAD_NICE = -10
# A detector thread that wakes this much later than it asked to was not running: its
# process, or the whole machine, stalled. Silence over a stall is not counted, on either
# side: a 0.6 s stop of every process of a 16-rank job (as a VM's host stops it) made 588
# heartbeat suspicions and 3 cut-offs in one trial before (docs/scale-journal.md "A machine that
# stops").
STALL_MIN_S = 0.1


def run_ahead(tid: int = 0) -> int:
    """Give thread or process `tid` (0: the calling thread) nice AHEAD_NICE; threads it
    starts later inherit it. Returns the nice value it runs at: unchanged where the process
    may not raise its priority (a container without CAP_SYS_NICE)."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, AHEAD_NICE)
    except PermissionError:
        pass
    return os.getpriority(os.PRIO_PROCESS, tid)


def not_ahead(who: str, nice: int) -> str | None:
    """The line `who` prints when run_ahead could not raise its priority, else None."""
    if nice == AHEAD_NICE:
        return None
    return (f"{who}: runs at nice {nice}, not {AHEAD_NICE} (no CAP_SYS_NICE): beside busy ranks on "
            "few cores the failure detector may take a late heartbeat or digest for silence "
            "(docs/scale.md)")


class PhiAccrual:
    """Hayashibara et al.'s phi: -log10 P(a heartbeat comes later than this silence), with
    arrival intervals modelled as a normal distribution over a sliding window."""

    def __init__(self, window: int = PHI_WINDOW, min_std_s: float = PHI_MIN_STD_S) -> None:
        self.intervals: collections.deque[float] = collections.deque(maxlen=window)
        self.min_std_s = min_std_s
        self.last: float | None = None

    def heartbeat(self, now: float) -> None:
        if self.last is not None:
            self.intervals.append(now - self.last)
        self.last = now

    def silence(self, now: float) -> float:
        return 0.0 if self.last is None else max(0.0, now - self.last)

    def discount(self, stalled_s: float) -> None:
        """Count no silence over `stalled_s` in which the judge was not running (nor, if the
        whole machine stopped, the sender): its next interval is a usual one, not a gap."""
        if self.last is not None:
            self.last += stalled_s

    def phi(self, now: float) -> float:
        if len(self.intervals) < 2:
            return 0.0
        mean = sum(self.intervals) / len(self.intervals)
        var = sum((x - mean) ** 2 for x in self.intervals) / len(self.intervals)
        y = (self.silence(now) - mean) / max(math.sqrt(var), self.min_std_s)
        if y <= -10:  # far earlier than usual: no suspicion (and exp would overflow)
            return 0.0
        # the logistic approximation of the normal CDF (as in Akka)
        e = math.exp(-y * (1.5976 + 0.070566 * y * y))
        p_later = e / (1.0 + e) if y > 0 else 1.0 - 1.0 / (1.0 + e)
        return -math.log10(max(p_later, 1e-300))


def floor_for(suspect_after_s: float) -> float:
    """The least silence a rank judging with `suspect_after_s` reads (FailureDetector: a
    silence under it is no verdict), which it asks the digests to report exactly."""
    return suspect_after_s / 4


class Stalls:
    """The seconds a thread that wakes at least every `period_s` was not running: each
    wake later than that by STALL_MIN_S or more is a stall of the excess. `woke` is called
    by that thread; `since` by any."""

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self.clock = clock
        self.last = clock()
        self.recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=64)  # (end, secs)

    def restart(self) -> None:
        """The thread starts waking now (a late start is no stall)."""
        self.last = self.clock()

    def woke(self) -> float:
        """Record a wake; returns the stall it ends (0.0 when on time)."""
        now = self.clock()
        excess, self.last = now - self.last - self.period_s, now
        if excess < STALL_MIN_S:
            return 0.0
        self.recent.append((now, excess))
        return excess

    def since(self, t: float) -> float:
        """Seconds stalled after `t`, with the stall in progress (the thread is late now)."""
        now = self.clock()
        stalled = sum(min(secs, end - t) for end, secs in list(self.recent) if end > t)
        due = self.last + self.period_s
        if now - due >= STALL_MIN_S:
            stalled += now - max(due, t)
        return stalled


@dataclass
class _Member:
    accrual: PhiAccrual
    addr: tuple[str, int] | None = None
    gen: int = -1
    floor_s: float = 0.0     # as its lease announced (0 until then: every silence is told)
    leases: int = 0          # open TCP leases (a reconnect briefly has two)
    seq: int = 0             # of its last heartbeat
    closed: bool = False     # every lease it opened has closed: the process is gone
    arrivals: collections.deque | None = None  # (t, seq) in the loss window

    def loss(self) -> float:
        if not self.arrivals or len(self.arrivals) < 2:
            return 0.0
        expected = self.arrivals[-1][1] - self.arrivals[0][1] + 1
        return max(0.0, 1.0 - len(self.arrivals) / expected)


class HeartbeatServer:
    """Runs in the control process (a daemon thread): collects heartbeats, serves digests."""

    def __init__(self, port: int, host: str = "0.0.0.0",
                 clock: Callable[[], float] = time.monotonic,
                 rejoin_requests: Callable[[], int] = lambda: 0,
                 on_stall: Callable[[float], None] = lambda secs: None,
                 on_gap: Callable[[int, float], None] | None = None,
                 on_deaf: Callable[[float], None] = lambda secs: None) -> None:
        self.clock = clock
        self.rejoin_requests = rejoin_requests
        self.on_stall = on_stall  # told the seconds of each stall of its own it discounts
        self.on_deaf = on_deaf    # told the seconds of each time it heard no rank, which it discounts too
        self._last_heard: float | None = None  # the newest heartbeat of any rank
        self.on_gap = on_gap      # told (rank, seconds) of every gap between a rank's heartbeats (harness.job.gaps)
        self._asks = 0
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, port))
        self.udp.setblocking(False)
        try:  # past net.core.rmem_max where the process may (CAP_NET_ADMIN)
            self.udp.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
        except PermissionError:
            self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind((host, port))
        self.tcp.listen(1024)
        self.tcp.setblocking(False)
        self.members: dict[int, _Member] = {}
        self._least_floor = 0.0  # of the members' floors: kept as they change, not per heartbeat
        self._leases: dict[socket.socket, int | None] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.udp, selectors.EVENT_READ, "udp")
        self._selector.register(self.tcp, selectors.EVENT_READ, "accept")
        self.stalls = Stalls(TICK_S, clock)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="heartbeat-server", daemon=True)
        self._counter = threading.Thread(target=self._count_asks, name="rejoin-requests", daemon=True)

    def start(self) -> "HeartbeatServer":
        self._thread.start()
        self._counter.start()
        return self

    def stop(self, deadline_s: float = SERVER_STOP_S) -> None:
        """Ends both threads and closes the sockets: for a process that goes on without its
        control plane (a test); the control process just exits. Stopping twice is harmless."""
        self._stopped.set()
        end = time.monotonic() + deadline_s
        for thread in (self._thread, self._counter):
            if thread.is_alive():
                thread.join(max(0.0, end - time.monotonic()))
        if self._thread.is_alive():
            raise TimeoutError(f"the heartbeat server's thread did not end within {deadline_s:g} s")
        for conn in (*self._leases, self.udp, self.tcp):
            conn.close()
        self._leases.clear()
        self._selector.close()

    def _count_asks(self) -> None:
        """Keeps the rejoin request count for the digests. On a thread of its own: the count
        is a store round trip, and a store slow to answer must not hold the digests back
        (at 128 ranks on 2 cores the longest took 33 ms, in one run; a rank that hears no
        digest for `suspect_after` takes itself for cut off)."""
        while not self._stopped.is_set():
            try:
                self._asks = self.rejoin_requests()
            except RuntimeError:  # the store in this process (torch's errors): the last count will do
                pass
            self._stopped.wait(ASKS_POLL_S)

    def _member(self, rank: int) -> _Member:
        if rank not in self.members:
            self.members[rank] = _Member(PhiAccrual(), arrivals=collections.deque())
            self._least_floor = 0.0  # its floor is 0 until its lease says it
        return self.members[rank]

    def _serve(self) -> None:
        next_tick = self.clock()
        self.stalls.restart()
        while not self._stopped.is_set():
            changed = False
            ready = self._selector.select(max(0.0, next_tick - self.clock()))
            if (stalled := self.stalls.woke()) > 0:  # before draining: what arrives now is fresh
                for member in self.members.values():
                    member.accrual.discount(stalled)
                if self._last_heard is not None:  # discounted once, not again as deafness
                    self._last_heard += stalled
                self.on_stall(stalled)
            for key, _ in ready:
                changed |= self._handle(key)
            now = self.clock()
            if changed or now >= next_tick:
                self._drain_udp()  # silence is judged only after reading what has arrived
                if not self.deaf(now := self.clock()):
                    self._broadcast(now)
                next_tick = max(next_tick + TICK_S, now)

    def deaf(self, now: float) -> bool:
        """It heard no heartbeat from any of two or more ranks for the least floor they judge
        by (DEAF_AFTER_S at least): every rank silent at once is this server cut off (its
        host's link down, a partition), not every rank gone. Its digest would accuse them
        all; it sends none, and when it hears them again their silence is not counted."""
        return (self._last_heard is not None and len(self.members) >= 2
                and now - self._last_heard >= max(DEAF_AFTER_S, self._least_floor))

    def _handle(self, key: selectors.SelectorKey) -> bool:
        """Returns True when a lease closed (the digest goes out at once)."""
        if key.data == "udp":
            self._drain_udp()
        elif key.data == "accept":
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return False
            conn.setblocking(False)
            self._leases[conn] = None
            self._selector.register(conn, selectors.EVENT_READ, "lease")
        else:
            return self._read_lease(key.fileobj)  # type: ignore[arg-type]
        return False

    def _read_lease(self, conn: socket.socket) -> bool:
        try:
            data = conn.recv(64)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        rank = self._leases.get(conn)
        if data and rank is None and (hello := _hello(data)) is not None:
            rank, floor_s = hello
            self._leases[conn] = rank
            member = self._member(rank)
            member.floor_s = floor_s
            self._least_floor = min(m.floor_s for m in self.members.values())
            member.leases += 1
            member.closed = False
            return False
        if data and rank is not None:
            return False
        self._selector.unregister(conn)
        conn.close()
        self._leases.pop(conn, None)
        if rank is None:
            return False
        member = self._member(rank)
        member.leases -= 1
        member.closed = member.leases <= 0
        return member.closed

    def _drain_udp(self) -> None:
        while True:
            try:
                data, addr = self.udp.recvfrom(256)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if (greeting := _greeting(data)) is not None:
                self._member(greeting).addr = addr  # digests go there; no beat yet
                continue
            if (beat := _heartbeat(data)) is None:
                continue
            rank, seq, gen = beat
            now = self.clock()
            if self.deaf(now):
                assert self._last_heard is not None
                for deafened in self.members.values():
                    deafened.accrual.discount(now - self._last_heard)
                self.on_deaf(now - self._last_heard)
            self._last_heard = now
            member = self._member(rank)
            # a gap as judged (a stall of the server's own discounted); a heart that
            # started its count anew belongs to a new process of the rank: no gap
            if self.on_gap is not None and member.accrual.last is not None and seq > member.seq:
                self.on_gap(rank, now - member.accrual.last)
            member.seq = seq
            member.accrual.heartbeat(now)
            member.addr, member.gen = addr, gen
            assert member.arrivals is not None
            member.arrivals.append((now, seq))
            while member.arrivals and member.arrivals[0][0] < now - LOSS_WINDOW_S:
                member.arrivals.popleft()

    def digest(self, now: float) -> bytes:
        """Every rank's state, to the precision the least of their floors needs: phi (a
        sum over a rank's last PHI_WINDOW intervals) only where the silence reaches it."""
        floor = self._least_floor
        peers = {}
        for rank, m in self.members.items():
            silent = m.accrual.silence(now)
            phi = min(m.accrual.phi(now), 99.0) if silent >= floor else 0.0
            peers[rank] = PeerState(silent, phi, m.closed, m.gen, m.loss())
        return encode_digest(peers, self._asks, floor)

    def _broadcast(self, now: float) -> None:
        payload = self.digest(now)
        for sent, member in enumerate(list(self.members.values()), 1):
            if member.addr is not None and not member.closed:
                try:
                    self.udp.sendto(payload, member.addr)
                except OSError:
                    pass  # a full buffer or an unreachable rank: the next digest will do
            if sent % DRAIN_EVERY == 0:
                self._drain_udp()


def _hello(data: bytes) -> tuple[int, float] | None:
    """A lease's first line, "<rank> [<floor>]"; None for anything else (whatever else
    connects to the port is let go, never the server's thread)."""
    try:
        hello = data.split()
        rank, floor_s = int(hello[0]), float(hello[1]) if len(hello) > 1 else 0.0
    except (ValueError, IndexError):
        return None
    return (rank, floor_s) if 0 <= rank < MAX_RANKS and 0 <= floor_s < math.inf and len(hello) <= 2 else None


def _greeting(data: bytes) -> int | None:
    """The rank of "hi <rank>" (HeartbeatClient._greet); None for any other datagram."""
    parts = data.split()
    if len(parts) != 2 or parts[0] != b"hi" or not parts[1].isdigit():
        return None
    rank = int(parts[1])
    return rank if rank < MAX_RANKS else None


def _heartbeat(data: bytes) -> tuple[int, int, int] | None:
    """(rank, seq, generation) of "hb <rank> <seq> <gen>"; None for any other datagram."""
    parts = data.split()
    if len(parts) != 4 or parts[0] != b"hb":
        return None
    try:
        rank, seq, gen = (int(part) for part in parts[1:])
    except ValueError:
        return None
    return (rank, seq, gen) if 0 <= rank < MAX_RANKS else None


class PeerState(NamedTuple):
    silent_s: float   # since its last heartbeat, as the server saw it when it sent the digest
    phi: float
    closed: bool      # its lease closed: the process is gone
    gen: int          # the generation it last reported
    loss: float       # fraction of its heartbeats lost recently


# The digest: a header, then the ranks it lists, one column per field (little endian). It
# lists every rank below n with something to tell: not heard from (flags 0), lease closed,
# heartbeats lost, a generation other than the header's, or silent for at least the floor.
# Every other rank is fresh: heard, silent under the floor (read as 0), in the header's
# generation, nothing lost.
DIGEST_MAGIC = b"hbd2"
_HEADER = struct.Struct("<4sIIIi")  # magic, requests to rejoin so far, n, listed, generation of the fresh
HEARD, CLOSED = 1, 2                # flags
_COLUMNS = (("rank", "I"), ("flags", "B"), ("silent_s", "f"), ("phi", "f"), ("gen", "i"), ("loss", "f"))
_BYTES_PER_RANK = sum(struct.calcsize(code) for _, code in _COLUMNS)
MAX_RANKS = (DATAGRAM_MAX - _HEADER.size) // _BYTES_PER_RANK  # one digest is one datagram, every rank listed


def encode_digest(peers: Mapping[int, PeerState], asks: int, floor_s: float = 0.0) -> bytes:
    """`peers` as ranks whose judgements read no silence under `floor_s` need them."""
    n = max(peers, default=-1) + 1
    if n > MAX_RANKS:
        raise ValueError(f"a digest holds at most {MAX_RANKS} ranks (one datagram), got rank {n - 1}")
    common = collections.Counter(state.gen for state in peers.values()).most_common(1)
    gen = common[0][0] if common else 0
    columns = {name: array.array(code) for name, code in _COLUMNS}
    for rank in range(n):
        state = peers.get(rank)
        if (state is not None and not state.closed and state.loss == 0 and state.gen == gen
                and state.silent_s < floor_s):
            continue  # fresh
        row = (rank, 0, 0.0, 0.0, 0, 0.0) if state is None else (
            rank, HEARD | (CLOSED if state.closed else 0), state.silent_s, state.phi, state.gen, state.loss)
        for (name, _), value in zip(_COLUMNS, row, strict=True):
            columns[name].append(value)
    listed = len(columns["rank"])
    return b"".join([_HEADER.pack(DIGEST_MAGIC, asks, n, listed, gen),
                     *(columns[name].tobytes() for name, _ in _COLUMNS)])


class View:
    """One digest as a rank received it: `flags` and the columns are indexed by rank (see
    `state` for one rank's entry as a value)."""

    __slots__ = ("received", "asks", "flags", "silent_s", "phi", "gen", "loss")

    def __init__(self, received: float, asks: int, flags: bytearray, silent_s: array.array,
                 phi: array.array, gen: array.array, loss: array.array) -> None:
        self.received = received   # local time the digest arrived
        self.asks = asks           # requests to rejoin so far (the store's counter)
        self.flags = flags
        self.silent_s, self.phi, self.gen, self.loss = silent_s, phi, gen, loss

    def ranks(self) -> list[int]:
        """The ranks the server has heard from."""
        return [rank for rank, f in enumerate(self.flags) if f & HEARD]

    def state(self, rank: int) -> PeerState | None:
        if not 0 <= rank < len(self.flags) or not self.flags[rank] & HEARD:
            return None
        return PeerState(self.silent_s[rank], self.phi[rank], bool(self.flags[rank] & CLOSED),
                         self.gen[rank], self.loss[rank])


def parse_digest(data: bytes, received: float) -> View:
    """Raises ValueError for anything but a whole digest."""
    if len(data) < _HEADER.size:
        raise ValueError(f"a digest is at least {_HEADER.size} bytes, got {len(data)}")
    magic, asks, n, listed, gen = _HEADER.unpack_from(data)
    if magic != DIGEST_MAGIC or listed > n or len(data) != _HEADER.size + listed * _BYTES_PER_RANK:
        raise ValueError(f"not a digest listing {listed} of {n} ranks ({len(data)} bytes, magic {magic!r})")
    body, offset = memoryview(data)[_HEADER.size:], 0
    listing = []
    for _, code in _COLUMNS:
        size = struct.calcsize(code) * listed
        listing.append(body[offset:offset + size].cast(code))
        offset += size
    flags = bytearray([HEARD]) * n
    silent_s, phi, loss = (array.array("f", bytes(4 * n)) for _ in range(3))
    gens = array.array("i", [gen]) * n
    for i, rank in enumerate(listing[0]):
        if rank >= n:
            raise ValueError(f"not a digest: it lists rank {rank} of {n}")
        flags[rank], silent_s[rank], phi[rank], gens[rank], loss[rank] = (column[i] for column in listing[1:])
    return View(received, asks, flags, silent_s, phi, gens, loss)


class HeartbeatClient:
    """The rank's side. Its heart (`harness.job.heart`, a child process) sends the
    heartbeats on the client's UDP socket; a thread here drains the digests that come back
    and tells the heart the rank's generation. Digests are read by whoever asks first."""

    nice: int  # the heart's nice value, set by start()

    def __init__(self, address: tuple[str, int], rank: int, interval_s: float,
                 generation: Callable[[], int], floor_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address = address
        self.rank = rank
        self.interval_s = interval_s
        self.generation = generation
        self.clock = clock
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.connect(address)
        self._udp.setblocking(False)
        self._lease = socket.create_connection(address, timeout=LEASE_CONNECT_TIMEOUT_S)
        self._lease.sendall(f"{rank} {floor_s!r}\n".encode())  # floor_s: see floor_for
        self._greet()
        self._lock = threading.Lock()
        self._view: View | None = None
        self._told = generation()
        self._heart: subprocess.Popen | None = None
        self._to_heart = -1
        self._stopped = threading.Event()
        self.stalls = Stalls(interval_s, clock)  # this process's, as the listener sees them
        self._thread = threading.Thread(target=self._listen, name="digests", daemon=True)

    def start(self) -> "HeartbeatClient":
        gen_read, self._to_heart = os.pipe()
        fds = (self._udp.fileno(), gen_read)
        self._heart = subprocess.Popen(
            [sys.executable, "-S", "-I", str(Path(__file__).with_name("heart.py")), *map(str, fds),
             str(self.rank), repr(self.interval_s), str(os.getpid()), str(self._told)],
            pass_fds=fds, stdin=subprocess.DEVNULL)
        os.close(gen_read)  # the heart's only: it sees EOF when this process is gone
        self.nice = run_ahead(self._heart.pid)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the heart now (a rank never needs to: the heart ends when the rank does)."""
        with self._lock:  # never a write to the closed pipe's number, reused meanwhile
            if self._stopped.is_set():
                return
            self._stopped.set()
            os.close(self._to_heart)
        assert self._heart is not None
        try:
            self._heart.wait(timeout=HEART_STOP_S)
        except subprocess.TimeoutExpired:  # stopped by a pause fault: end of file cannot wake it
            self._heart.kill()
            self._heart.wait()
        self._lease.close()

    def _greet(self) -> None:
        """Tell the control plane where to send this rank's digests. It learns a rank's
        address from a datagram; waiting for the heart's first beat would make the rank's
        cut-off verdict hang on how fast a new interpreter starts on a loaded machine.
        A greeting is not a heartbeat: peers judge this rank from its heart's first beat."""
        try:
            self._udp.send(f"hi {self.rank}".encode())
        except OSError:
            pass  # the control plane is not reachable (yet): greeted again until a digest comes

    def _listen(self) -> None:
        run_ahead()  # a stall probe: late only when the process (or the machine) was stopped
        self.stalls.restart()
        while not self._stopped.wait(self.interval_s):
            self.stalls.woke()
            if self.view() is None:  # keeps the socket drained while the rank is busy
                self._greet()
            with self._lock:
                if self._stopped.is_set() or (gen := self.generation()) == self._told:
                    continue
                try:
                    os.write(self._to_heart, f"{gen}\n".encode())
                except OSError:
                    pass  # the heart is gone (killed with the rank's tree): silence says so
                self._told = gen

    def view(self) -> View | None:
        """The newest digest, after draining the socket (so a late reader sees fresh news);
        only the newest is read."""
        with self._lock:
            arrived = []
            while True:
                try:
                    arrived.append(self._udp.recv(DATAGRAM_MAX))
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break  # ICMP port unreachable while the control plane is away
            for data in reversed(arrived):
                try:
                    self._view = parse_digest(data, self.clock())
                    break
                except ValueError:
                    continue
            return self._view


@dataclass(frozen=True)
class Suspicion:
    peer: int
    via: str          # connection (process gone) | heartbeat (silent) | cut-off (this rank
                      # hears no digest) | generation (a peer moved on: this group is stale)
    silent_s: float

    def describe(self) -> str:
        if self.via == "cut-off":
            return f"this rank heard nothing from the control plane for {self.silent_s:.2f}s"
        if self.via == "connection":
            return f"rank {self.peer} is gone (its heartbeat lease closed)"
        if self.via == "generation":
            return f"rank {self.peer} has moved to a newer generation"
        return f"rank {self.peer} silent for {self.silent_s:.2f}s"


@dataclass(frozen=True)
class Straggler:
    peer: int
    loss: float
    silent_s: float


class FailureDetector:
    """Judges the newest digest for a set of members: pure given `view` and `now`."""

    def __init__(self, view: Callable[[], View | None], me: int, suspect_after_s: float,
                 phi_threshold: float | None, straggler_loss: float,
                 clock: Callable[[], float] = time.monotonic,
                 stalled_since: Callable[[float], float] = lambda t: 0.0) -> None:
        self.view = view
        self.stalled_since = stalled_since  # seconds this process was stopped after a time
        self.me = me
        self.suspect_after_s = suspect_after_s
        self.phi_threshold = phi_threshold
        self.straggler_loss = straggler_loss
        self.clock = clock
        self.started = clock()
        self._judged: tuple[View, tuple[int, ...], int, list[Suspicion]] | None = None
        self._last_step: float | None = None

    def stepped(self) -> None:
        """This rank finished a step with its group: its way to its peers worked just now."""
        self._last_step = self.clock()

    def judge(self, members: tuple[int, ...], generation: int) -> list[Suspicion]:
        """Members suspected now (this rank first if it is the one cut off)."""
        now = self.clock()
        view = self.view()
        heard = view.received if view is not None else self.started
        if now - heard - self.stalled_since(heard) >= self.suspect_after_s and not self._steps_go_on(now):
            return [Suspicion(self.me, "cut-off", round(now - heard, 3))]
        if view is None:
            return []
        # a rank asks every 0.02 s and a digest comes every TICK_S: judge each digest once
        if self._judged is not None and self._judged[0] is view and self._judged[1:3] == (members, generation):
            return list(self._judged[3])
        found = self._judge_peers(view, members, generation)
        self._judged = (view, members, generation, found)
        return list(found)

    def _steps_go_on(self, now: float) -> bool:
        """The group stepped within the silence's threshold: what went silent is the control
        plane (its host gone, paused or cut off), not this rank's way to its peers, and a
        rank that took itself for cut off would leave a group that trains (every rank at
        once). A rank cut off stops stepping too: the rule then holds as before."""
        return self._last_step is not None and now - self._last_step < self.suspect_after_s

    def _judge_peers(self, view: View, members: tuple[int, ...], generation: int) -> list[Suspicion]:
        # reads the columns in place, not `view.state`: once per digest, 20 times a second
        found = []
        flags, n = view.flags, len(view.flags)
        for peer in members:
            if peer == self.me or not (0 <= peer < n and flags[peer] & HEARD):
                continue
            silent = view.silent_s[peer]  # not extrapolated: a stale view is the cut-off rule's case
            if flags[peer] & CLOSED:
                found.append(Suspicion(peer, "connection", round(silent, 3)))
            elif self._silent(view.phi[peer], silent):
                found.append(Suspicion(peer, "heartbeat", round(silent, 3)))
            elif view.gen[peer] > generation >= 0:
                found.append(Suspicion(peer, "generation", round(silent, 3)))
        return found

    def _silent(self, phi: float, silent: float) -> bool:
        if self.phi_threshold is None:
            return silent >= self.suspect_after_s
        # phi decides, but never on a silence shorter than a few heartbeats
        return phi >= self.phi_threshold and silent >= floor_for(self.suspect_after_s)

    def rejoin_asks(self) -> int:
        """How many times a rank has asked to rejoin, as of the newest digest."""
        view = self.view()
        return 0 if view is None else view.asks

    def stragglers(self, members: tuple[int, ...]) -> list[Straggler]:
        """Alive members whose heartbeats arrive degraded (lossy or late): slow, not dead."""
        view = self.view()
        if view is None:
            return []
        states = ((p, view.state(p)) for p in sorted(members))
        return [Straggler(p, round(s.loss, 3), round(s.silent_s, 3)) for p, s in states
                if s is not None and not s.closed
                and (s.loss >= self.straggler_loss or s.silent_s >= self.suspect_after_s / 2)]
