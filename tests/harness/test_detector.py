"""The failure detector: phi-accrual and the verdicts on fake clocks; the heartbeat server
and client over loopback (real sockets, no namespaces, no root)."""
from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness.job.detector import (AHEAD_NICE, MAX_RANKS, STALL_MIN_S, FailureDetector, HeartbeatClient,
                                  HeartbeatServer, PeerState, PhiAccrual, Stalls, View, encode_digest,
                                  floor_for, not_ahead, parse_digest)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_phi_grows_with_silence_and_stays_low_on_time():
    acc = PhiAccrual()
    for i in range(50):
        acc.heartbeat(i * 0.1)
    last = 49 * 0.1
    assert acc.phi(last + 0.1) < 1            # on time
    assert acc.phi(last + 0.3) > 3            # a few beats late
    assert acc.phi(last + 1.0) > acc.phi(last + 0.5) > 8
    assert acc.phi(last - 5.0) < 0.05         # a clock read before the beat: no suspicion


def test_phi_tolerates_the_jitter_it_has_seen():
    steady, jittery = PhiAccrual(), PhiAccrual()
    t1 = t2 = 0.0
    for i in range(60):
        t1 += 0.1
        t2 += 0.1 + (0.25 if i % 3 == 0 else 0.0)  # a starved sender: late every third beat
        steady.heartbeat(t1)
        jittery.heartbeat(t2)
    assert jittery.phi(t2 + 0.5) < steady.phi(t1 + 0.5)


def view(clock: Clock, age: float = 0.0, **peers: PeerState) -> View:
    """A digest as it travels: encoded by the server's code, read by the rank's."""
    return parse_digest(encode_digest({int(k[1:]): v for k, v in peers.items()}, 0), clock.t - age)


def alive(gen: int = 0, silent: float = 0.05, loss: float = 0.0) -> PeerState:
    return PeerState(silent, 0.5, False, gen, loss)


def detector(clock: Clock, current: list[View | None], **kw) -> FailureDetector:
    args = {"suspect_after_s": 0.8, "phi_threshold": None, "straggler_loss": 0.05, **kw}
    return FailureDetector(lambda: current[0], me=0, clock=clock, **args)


def test_no_suspicion_while_every_member_beats():
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive(), r2=alive())]
    assert detector(clock, current).judge((0, 1, 2), 0) == []


def test_silent_peer_is_suspect_after_the_threshold_only():
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive(silent=0.79), r2=alive())]
    d = detector(clock, current)
    assert d.judge((0, 1, 2), 0) == []
    current[0] = view(clock, r0=alive(), r1=alive(silent=0.81), r2=alive())
    [s] = d.judge((0, 1, 2), 0)
    assert (s.peer, s.via) == (1, "heartbeat")
    assert d.judge((0, 2), 0) == []  # not a member: not this group's problem


def test_a_digest_is_judged_once_per_group_and_the_verdict_is_the_callers():
    """A rank asks every 0.02 s and a digest comes every 0.05 s: the same digest for the same
    members and generation is not judged again; another digest, member set or generation is."""
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive(silent=0.9), r2=alive(gen=3))]
    d = detector(clock, current)
    first = d.judge((0, 1, 2), 2)
    assert [(s.peer, s.via) for s in first] == [(1, "heartbeat"), (2, "generation")]
    first.clear()  # the caller's list: emptying it changes no later verdict
    assert [s.peer for s in d.judge((0, 1, 2), 2)] == [1, 2]
    assert [s.peer for s in d.judge((0, 2), 2)] == [2]
    assert d.judge((0, 2), 3) == []
    current[0] = view(clock, r0=alive(), r1=alive(), r2=alive(gen=3))
    assert [s.peer for s in d.judge((0, 1, 2), 2)] == [2]
    clock.t += 0.9  # the same digest, now stale: this rank is the one cut off
    assert [s.via for s in d.judge((0, 1, 2), 2)] == ["cut-off"]


def test_closed_lease_is_suspect_at_once():
    clock = Clock()
    current = [view(clock, r0=alive(), r1=PeerState(0.01, 0.0, True, 0, 0.0))]
    [s] = detector(clock, current).judge((0, 1), 0)
    assert (s.peer, s.via) == (1, "connection")


def test_stale_view_means_this_rank_is_cut_off_not_that_peers_died():
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive(), r2=alive())]
    d = detector(clock, current)
    clock.t += 0.7
    assert d.judge((0, 1, 2), 0) == []
    clock.t += 0.2
    [s] = d.judge((0, 1, 2), 0)
    assert (s.peer, s.via) == (0, "cut-off") and s.silent_s == pytest.approx(0.9)


def test_a_silent_control_plane_while_the_group_steps_is_no_cut_off():
    """The store's host paused, killed or cut off: every rank's digests stop at once while
    their steps go on. Taking that for a cut-off would make every rank leave a group that
    trains; a rank whose own link went down stops stepping too, and is cut off as before."""
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive(), r2=alive())]
    d = detector(clock, current)
    for _ in range(8):  # 2 s without a digest, a step every 0.25 s
        clock.t += 0.25
        d.stepped()
        assert d.judge((0, 1, 2), 0) == []
    clock.t += 0.79  # steps stop too: the threshold counts from the last step
    assert d.judge((0, 1, 2), 0) == []
    clock.t += 0.02
    [s] = d.judge((0, 1, 2), 0)
    assert (s.peer, s.via) == (0, "cut-off") and s.silent_s == pytest.approx(2.81)


def test_stalls_are_the_wakes_later_than_the_period_by_the_minimum_or_more():
    clock = Clock(0.0)
    stalls = Stalls(0.05, clock)
    for _ in range(10):  # on time, and late by less than a stall
        clock.t += 0.05 + STALL_MIN_S / 2
        assert stalls.woke() == 0.0
    start = clock.t
    clock.t += 0.65
    assert stalls.woke() == pytest.approx(0.6)
    assert stalls.since(start - 1.0) == pytest.approx(0.6)
    assert stalls.since(clock.t - 0.2) == pytest.approx(0.2)  # only the part after the time asked
    assert stalls.since(clock.t) == 0.0
    clock.t += 0.05 + 0.3  # late now, not yet awake: the stall in progress counts
    assert stalls.since(clock.t - 1.0) == pytest.approx(0.6 + 0.3)


def test_a_silence_while_this_process_was_stopped_is_no_cut_off():
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive())]
    stopped = [0.0]
    d = detector(clock, current, stalled_since=lambda t: stopped[0])
    clock.t += 1.0
    stopped[0] = 0.6   # a machine that stopped for 0.6 s: 0.4 s heard nothing while running
    assert d.judge((0, 1), 0) == []
    clock.t += 0.4
    [s] = d.judge((0, 1), 0)
    assert (s.peer, s.via) == (0, "cut-off") and s.silent_s == pytest.approx(1.4)


def test_the_server_counts_no_silence_over_its_own_stall():
    acc = PhiAccrual()
    for i in range(50):
        acc.heartbeat(i * 0.1)
    acc.discount(0.6)
    assert acc.silence(4.9 + 0.7) == pytest.approx(0.1) and acc.phi(4.9 + 0.7) < 1
    acc.heartbeat(4.9 + 0.7)
    assert acc.intervals[-1] == pytest.approx(0.1)  # not a 0.7 s gap in its history


def test_never_hearing_a_digest_is_a_cut_off_after_the_threshold():
    clock = Clock()
    d = detector(clock, [None])
    assert d.judge((0, 1), 0) == []
    clock.t += 1.0
    assert [s.via for s in d.judge((0, 1), 0)] == ["cut-off"]


def test_a_peer_in_a_newer_generation_means_this_group_is_stale():
    clock = Clock()
    current = [view(clock, r0=alive(gen=0), r1=alive(gen=1))]
    d = detector(clock, current)
    assert [s.via for s in d.judge((0, 1), 0)] == ["generation"]
    assert d.judge((0, 1), 1) == []
    assert d.judge((0, 1), -1) == []  # not in a group: nothing is stale


def test_phi_mode_needs_both_phi_and_some_silence():
    clock = Clock()
    d = detector(clock, [view(clock, r0=alive(), r1=PeerState(0.15, 12.0, False, 0, 0.0))], phi_threshold=8)
    assert d.judge((0, 1), 0) == []  # phi high on a tiny silence: not enough
    d = detector(clock, [view(clock, r0=alive(), r1=PeerState(0.3, 12.0, False, 0, 0.0))], phi_threshold=8)
    assert [s.via for s in d.judge((0, 1), 0)] == ["heartbeat"]


def test_lossy_or_late_alive_peer_is_a_straggler_not_a_suspect():
    clock = Clock()
    current = [view(clock, r0=alive(), r1=alive(loss=0.2), r2=alive(silent=0.5), r3=alive())]
    d = detector(clock, current)
    assert d.judge((0, 1, 2, 3), 0) == []
    assert [s.peer for s in d.stragglers((0, 1, 2, 3))] == [1, 2]


def test_digest_round_trip():
    sent = {3: PeerState(0.25, 1.5, True, 2, 0.125), 0: PeerState(0.0625, 0.5, False, 7, 0.0)}
    received = parse_digest(encode_digest(sent, asks=2), 7.0)
    assert (received.received, received.asks, received.ranks()) == (7.0, 2, [0, 3])
    assert {r: received.state(r) for r in (0, 3)} == sent
    assert received.state(1) is None and received.state(4) is None and received.state(-1) is None


def test_a_digest_lists_only_the_ranks_with_something_to_tell():
    """Under the floor a beating rank is "fresh": the digest says only that. A closed lease,
    lost heartbeats, another generation, a silence at the floor, or silence (flags 0) are
    told in full."""
    fresh = PeerState(0.0625, 0.75, False, 5, 0.0)  # binary fractions: a float32 column holds them
    sent = {0: fresh, 1: fresh, 2: PeerState(0.125, 2.5, False, 5, 0.0), 3: PeerState(0.015625, 0.25, True, 5, 0.0),
            4: PeerState(0.03125, 0.125, False, 5, 0.25), 5: PeerState(0.03125, 0.125, False, 4, 0.0), 7: fresh}
    data = encode_digest(sent, asks=1, floor_s=0.125)
    all_fresh = encode_digest({r: fresh for r in range(1024)}, asks=1, floor_s=0.125)
    assert len(all_fresh) == len(encode_digest({}, asks=1)) < 30  # whatever the ranks
    assert len(data) == len(all_fresh) + 5 * 21  # ranks 2-6
    received = parse_digest(data, 7.0)
    assert received.ranks() == [0, 1, 2, 3, 4, 5, 7]
    assert received.state(0) == received.state(7) == PeerState(0.0, 0.0, False, 5, 0.0)
    assert {r: received.state(r) for r in (2, 3, 4, 5)} == {r: sent[r] for r in (2, 3, 4, 5)}
    assert received.state(6) is None and received.state(8) is None


@pytest.mark.parametrize("suspect_after, phi", [(0.4, None), (0.8, None), (0.4, 8.0)])
def test_every_verdict_on_a_digest_under_its_floor_is_the_verdict_on_the_whole_one(suspect_after, phi):
    """Random memberships: the suspects and stragglers a rank finds are the same whether
    the digest tells every rank's state or only what its floor (`floor_for`) needs."""
    rng = random.Random(7)
    clock = Clock()
    for _ in range(300):
        peers = {r: PeerState(rng.choice([rng.uniform(0, 0.05), rng.uniform(0, 1.2)]), rng.uniform(0, 20),
                              rng.random() < 0.05, rng.choice([3, 3, 3, 4]),
                              rng.choice([0.0] * 8 + [0.04, 0.3]))
                 for r in range(24) if rng.random() < 0.95}
        members = tuple(sorted(rng.sample(range(24), 16)))
        whole, floored = (parse_digest(encode_digest(peers, 0, floor), clock.t)
                          for floor in (0.0, floor_for(suspect_after)))
        judges = [detector(clock, [v], suspect_after_s=suspect_after, phi_threshold=phi) for v in (whole, floored)]
        assert judges[0].judge(members, 3) == judges[1].judge(members, 3)
        assert [s.peer for s in judges[0].stragglers(members)] == [s.peer for s in judges[1].stragglers(members)]


def test_anything_but_a_whole_digest_is_refused():
    whole = encode_digest({0: PeerState(0.5, 1.0, False, 0, 0.0)}, asks=0)
    beyond = bytearray(whole)
    beyond[20:24] = (1).to_bytes(4, "little")  # the listed rank's id: 1 of n = 1
    for data in (b"", whole[:-1], whole + b"x", b"hbd0" + whole[4:], b'{"peers": {}}', bytes(beyond)):
        with pytest.raises(ValueError):
            parse_digest(data, 0.0)
    with pytest.raises(ValueError, match="at most"):
        encode_digest({MAX_RANKS: PeerState(0.5, 1.0, False, 0, 0.0)}, asks=0)
    assert len(encode_digest({MAX_RANKS - 1: PeerState(0.5, 1.0, False, 0, 0.0)}, asks=0)) <= 65507


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def control_plane():
    """Starts heartbeat servers on loopback, a free port each, and stops them after the test
    (a server left running would serve on, and log its stalls, for the rest of the session)."""
    servers = []

    def start(**options) -> tuple[HeartbeatServer, int]:
        port = _free_port()
        servers.append(server := HeartbeatServer(port, host="127.0.0.1", **options).start())
        return server, port

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def stalls():
    """The seconds this machine did not run this process, counted as a control plane counts
    its own (a thread waking every 10 ms; each wake late by STALL_MIN_S or more is a stall).
    A wall-clock bound below is what the code may take plus the stalls meanwhile: on slow
    hours of the shared build VM the whole machine stopped for 0.41-0.59 s at once (.ci/run),
    which no code here can shorten, while a regression (a closed lease noticed only by
    silence, a heart that waits for the rank's GIL, digests that wait for the store) costs
    the seconds it costs on any hour."""
    watch, done = Stalls(0.01), threading.Event()

    def wake() -> None:
        watch.restart()
        while not done.wait(watch.period_s):
            watch.woke()
    thread = threading.Thread(target=wake, name="stall watch", daemon=True)
    thread.start()
    yield watch
    done.set()
    thread.join()


def stalled_between(stalls: Stalls, start: float, end: float) -> float:
    return stalls.since(start) - stalls.since(end)


def wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met within the deadline")


def test_server_and_clients_over_loopback(control_plane, stalls):
    """Two ranks beat; one dies (its lease closes): the other hears it in a digest at once."""
    server, port = control_plane()
    gens = {0: 0, 1: 0}
    a = HeartbeatClient(("127.0.0.1", port), 0, 0.05, lambda: gens[0]).start()
    b = HeartbeatClient(("127.0.0.1", port), 1, 0.05, lambda: gens[1]).start()
    try:
        seen = wait_for(lambda: (v := a.view()) and v.ranks() == [0, 1] and v)
        assert not seen.state(1).closed and seen.state(1).silent_s < 0.5
        gens[1] = 4  # the generation reaches the heart, and with its beats the digest
        wait_for(lambda: a.view().state(1).gen == 4)
        b.stop()  # the lease closes, as the kernel closes it when the process dies
        started = time.monotonic()
        wait_for(lambda: a.view().state(1).closed)
        assert time.monotonic() - started < 0.3 + stalls.since(started)
        d = FailureDetector(a.view, 0, 0.8, None, 0.05)
        assert [s.via for s in d.judge((0, 1), 4)] == ["connection"]
        assert set(server.members) == {0, 1}
    finally:
        a.stop()
        b.stop()


def test_a_stopped_server_ends_its_threads_and_frees_its_port():
    port = _free_port()
    server = HeartbeatServer(port, host="127.0.0.1").start()
    lease = socket.create_connection(("127.0.0.1", port))
    wait_for(lambda: server._leases)
    server.stop()
    server.stop()
    assert not server._thread.is_alive() and not server._counter.is_alive()
    lease.settimeout(5.0)
    assert lease.recv(64) == b""  # its leases closed
    lease.close()
    HeartbeatServer(port, host="127.0.0.1").stop()  # both of its ports bind again


def test_ranks_announce_their_floor_and_a_digest_of_beating_ranks_is_its_header(control_plane):
    server, port = control_plane()
    a, b = (HeartbeatClient(("127.0.0.1", port), r, 0.05, lambda: 0, floor_s=0.1).start() for r in (0, 1))
    try:
        header = len(encode_digest({}, asks=0))
        wait_for(lambda: [(m.floor_s, bool(m.arrivals)) for m in server.members.values()] == [(0.1, True)] * 2
                 and len(server.digest(server.clock())) == header)
        os.kill(b._heart.pid, signal.SIGSTOP)  # rank 1 falls silent: the digests tell how long
        silent = wait_for(lambda: (v := a.view()) and (s := v.state(1)) and s.silent_s >= 0.3 and s.silent_s)
        assert silent < 2.0
    finally:
        os.kill(b._heart.pid, signal.SIGCONT)
        a.stop()
        b.stop()


def test_whatever_else_reaches_the_port_is_let_go_and_the_digests_go_on(control_plane):
    """A stranger's connection or datagrams (a port scan, another program) are dropped; a
    rank id past what a digest holds is not a rank. The server's thread serves on."""
    server, port = control_plane()
    stranger = socket.create_connection(("127.0.0.1", port))
    stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for junk in (b"hb x 1 2", b"hb -1 1 0", f"hb {MAX_RANKS} 1 0".encode(), b"hb 1 2", b"\xff" * 40,
                 b"hi x", b"hi -1", f"hi {MAX_RANKS}".encode(), b"hi 1 2"):
        udp.sendto(junk, ("127.0.0.1", port))
    rank = HeartbeatClient(("127.0.0.1", port), 0, 0.05, lambda: 0, floor_s=0.1).start()
    try:
        stranger.settimeout(5.0)
        assert stranger.recv(64) == b""  # closed by the server
        wait_for(lambda: (v := rank.view()) is not None and v.ranks() == [0])
        assert list(server.members) == [0] and server._thread.is_alive()
    finally:
        rank.stop()
        stranger.close()
        udp.close()


def test_a_rank_hears_digests_before_its_heart_beats_and_is_judged_from_its_first_beat(control_plane):
    """The control plane learns where to send a rank's digests from its greeting, not
    from its heart's first beat (a new interpreter, slow to start on a loaded machine):
    the rank does not take itself for cut off meanwhile, and its peers do not suspect it."""
    _, port = control_plane()
    late = HeartbeatClient(("127.0.0.1", port), 0, 0.05, lambda: 0, floor_s=0.1)  # no heart yet
    peer = HeartbeatClient(("127.0.0.1", port), 1, 0.05, lambda: 0, floor_s=0.1).start()
    try:
        wait_for(late.view)
        time.sleep(0.5)  # past suspect_after with no beat of rank 0's
        assert FailureDetector(late.view, 0, 0.4, None, 0.05).judge((0, 1), 0) == []
        assert FailureDetector(peer.view, 1, 0.4, None, 0.05).judge((0, 1), 0) == []
        late.start()
        wait_for(lambda: peer.view().state(0).gen == 0)  # its heart's first beat came
        os.kill(late._heart.pid, signal.SIGSTOP)  # from then on, silence counts
        suspects = wait_for(lambda: FailureDetector(peer.view, 1, 0.4, None, 0.05).judge((0, 1), 0))
        assert [(s.peer, s.via) for s in suspects] == [(0, "heartbeat")]
    finally:
        if late._heart is not None:
            os.kill(late._heart.pid, signal.SIGCONT)
            late.stop()
        peer.stop()


def test_heartbeats_that_arrive_while_the_server_is_busy_wait_in_its_socket():
    """3,000 heartbeats (150 ms of 1024 ranks') sent while the server's thread reads none
    are all there when it does: the kernel's default buffer holds about 200."""
    port = _free_port()
    server = HeartbeatServer(port, host="127.0.0.1")  # not started: nothing reads meanwhile
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for seq in range(1, 3001):
            sender.sendto(f"hb 3 {seq} 0".encode(), ("127.0.0.1", port))
        server._drain_udp()
        assert len(server.members[3].arrivals) == 3000
    finally:
        sender.close()
        server.stop()


def test_a_server_that_heard_no_rank_counts_their_silence_against_none():
    """The store's host cut off (a partition, its link): every rank's heartbeats stop at once.
    That silence is the server's own: it is deaf (it sends no digest meanwhile: it would
    accuse every rank), and once it hears them again their silence starts from then. One
    rank silent while the others beat is counted as before."""
    clock, port = Clock(), _free_port()
    server = HeartbeatServer(port, host="127.0.0.1", clock=clock)  # not started: drained by hand
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def beat(seq: int, *ranks: int) -> None:
        for rank in ranks:
            sender.sendto(f"hb {rank} {seq} 0".encode(), ("127.0.0.1", port))
        wait_for(lambda: server._drain_udp() or all(server.members[r].seq == seq for r in ranks))

    try:
        for seq in range(1, 6):
            clock.t += 0.05
            beat(seq, 0, 1, 2)
        assert not server.deaf(clock.t + 0.09) and server.deaf(clock.t + 0.11)
        clock.t += 8.0  # nothing heard from anyone
        beat(6, 0)
        told = parse_digest(server.digest(clock.t), clock.t)
        assert not server.deaf(clock.t)
        assert told.state(1).silent_s < 0.06 and told.state(2).silent_s < 0.06
        for seq in range(7, 13):  # r0 and r1 beat, r2 stays silent: counted
            clock.t += 0.05
            beat(seq, 0, 1)
        told = parse_digest(server.digest(clock.t), clock.t)
        assert told.state(2).silent_s == pytest.approx(0.3, abs=0.06) and told.state(1).silent_s < 0.06
    finally:
        sender.close()
        server.stop()


def test_digests_keep_their_tick_while_the_store_is_slow_to_give_the_rejoin_count(control_plane, stalls):
    """The rejoin count is a store round trip; a store busy for 1 s (every rank of a large
    group exchanging addresses through it) must not hold the digests back."""
    asked = []

    def slow_count() -> int:
        time.sleep(1.0)
        asked.append(time.monotonic())
        return len(asked)

    _, port = control_plane(rejoin_requests=slow_count)
    rank = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rank.settimeout(1.0)
    try:
        rank.sendto(b"hb 0 1 0", ("127.0.0.1", port))
        arrivals, counts = [], []
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            counts.append(parse_digest(rank.recv(65536), time.monotonic()).asks)
            arrivals.append(time.monotonic())
        gaps = [b - a - stalled_between(stalls, a, b) for a, b in itertools.pairwise(arrivals)]
        assert max(gaps) < 0.5, f"a digest came {max(gaps):.2f} s after the one before (the machine's stalls not counted)"
        assert counts[0] == 0 and counts[-1] >= 1  # the count still reaches the digests
    finally:
        rank.close()


def test_stopping_a_client_ends_even_a_frozen_heart(control_plane):
    """A heart stopped by a pause fault cannot read end of file: stop() kills it after its
    deadline, and stopping twice is harmless."""
    _, port = control_plane()
    client = HeartbeatClient(("127.0.0.1", port), 0, 0.05, lambda: 0).start()
    heart = client._heart
    os.kill(heart.pid, signal.SIGSTOP)
    started = time.monotonic()
    client.stop()
    client.stop()
    assert heart.returncode == -signal.SIGKILL and time.monotonic() - started < 5


# A rank whose main thread keeps the GIL for 1.5 s (a switch interval longer than that):
# its heart beats on; then it waits to be killed.
GIL_HOG = """
import sys, time
from harness.job.detector import HeartbeatClient
client = HeartbeatClient(("127.0.0.1", {port}), 7, 0.05, lambda: 0).start()
print(client._heart.pid, flush=True)
time.sleep(0.5)
sys.setswitchinterval(10.0)
print("holding", flush=True)
end = time.monotonic() + 1.5
while time.monotonic() < end:
    pass
sys.setswitchinterval(0.005)
print("released", flush=True)
time.sleep(60)
"""


def test_the_heart_beats_while_the_rank_holds_its_gil_and_dies_with_the_rank(control_plane, stalls):
    """The heartbeats come from a process of their own: a rank busy in Python (holding the
    GIL) is not silent, and a rank killed takes its heart with it."""
    server, port = control_plane()
    rank = subprocess.Popen([sys.executable, "-c", GIL_HOG.format(port=port)], stdout=subprocess.PIPE, text=True)
    try:
        heart = int(rank.stdout.readline())
        assert rank.stdout.readline() == "holding\n"
        longest, start = 0.0, time.monotonic()
        while time.monotonic() < start + 1.4:
            time.sleep(0.01)
            longest = max(longest, server.members[7].accrual.silence(server.clock()))
        assert rank.stdout.readline() == "released\n"  # it did hold the GIL all along
        assert longest < 0.3 + stalls.since(start), \
            f"silent for {longest:.2f} s while the rank held its GIL ({stalls.since(start):.2f} s of the machine's stalls)"
        rank.kill()
        rank.wait()
        wait_for(lambda: not os.path.exists(f"/proc/{heart}") or
                  open(f"/proc/{heart}/stat").read().rsplit(")", 1)[1].split()[0] == "Z")
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.requires_root
def test_a_process_that_may_not_run_ahead_keeps_its_nice_value():
    """A container without CAP_SYS_NICE (Kubernetes' baseline pods): the control plane and
    the heartbeats start anyway, at the nice value they have (and say so)."""
    def nice_after_run_ahead(as_user: int | None) -> str:
        drop = f"os.setuid({as_user}); " if as_user is not None else ""
        return subprocess.run(
            [sys.executable, "-c", "import os; from harness.job.detector import run_ahead; "
             f"{drop}print(run_ahead())"], capture_output=True, text=True, timeout=30, check=True).stdout.strip()

    own = os.getpriority(os.PRIO_PROCESS, 0)  # what the subprocess inherits
    assert nice_after_run_ahead(65534) == str(own)  # nobody: may not, carries on as it was
    assert nice_after_run_ahead(None) == "-10"      # root: runs ahead
    assert not_ahead("control plane", AHEAD_NICE) is None
    assert not_ahead("control plane", 0).startswith("control plane: runs at nice 0, not -10 (no CAP_SYS_NICE)")
