"""The rank's client of the rendezvous store: every call returns by a deadline.

torch's TCPStore client reads each reply with no deadline of its own: against a store
that stops answering (its host paused, partitioned, or cut off by this rank's own link
going down) `get`, `add`, `check`, `compare_set`, `wait` (after its own timeout it sends
a cancel and reads the acknowledgement) and the constructor's ping block for good, EINTR
is retried (a SIGTERM does not get in), and every later call on that client queues on
its lock (bench/results/tcpstore-wait-unanswered-2026-12-06.txt).

So each call runs on a thread of its own while the caller waits for it in slices (a
signal handler's exception, `Terminated`, gets in within one slice). A call still
unanswered at its deadline is abandoned with its connection: the connection's socket is
shut down, which ends the blocked read (and the thread) at once, and the next call opens
a fresh connection. A call on a connection whose earlier call was abandoned could read
that call's late reply as its own (a receive timeout on one shared socket does exactly
that), so no call ever goes to a connection after an abandoned one.

`StoreUnanswered` is a RuntimeError, the family torch's own store errors belong to, so
the callers' rendezvous error paths take it as they take a store's refusal.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import stat
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Sequence, TypeVar

import torch.distributed as dist

SLICE_S = 0.05  # how often a waiting caller wakes (for its signals) while a call is out
T = TypeVar("T")


class StoreUnanswered(RuntimeError):
    """The store did not answer a call by its deadline; the connection was abandoned."""


def _same_host(peer: str, host_ips: frozenset[str]) -> bool:
    address = ipaddress.ip_address(peer.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # torch connects over IPv6 sockets: [::ffff:a.b.c.d]
    return str(address) in host_ips


def _sockets_to(host_ips: frozenset[str], port: int) -> set[int]:
    """This process's file descriptors of TCP sockets connected to host:port."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                peer = sock.getpeername()
        except OSError:
            continue  # closed meanwhile, or not connected (a listener, a socket shut down)
        if peer[1] == port and _same_host(peer[0], host_ips):
            found.add(fd)
    return found


def _shut_down(fds: frozenset[int], host_ips: frozenset[str], port: int) -> None:
    """Shut these sockets down: a read blocked on one ends now, and a late reply has nowhere
    to go. Checked against the peer first: a descriptor number torch closed and the process
    reused is left alone."""
    for fd in fds & _sockets_to(host_ips, port):
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Connection:
    """One TCPStore client connection and the socket it holds (when it could be told apart)."""

    def __init__(self, store: dist.TCPStore, fds: frozenset[int], address: tuple[str, int],
                 host_ips: frozenset[str]) -> None:
        self.store = store
        self.address = address
        self._fds = fds
        self._host_ips = host_ips

    def abandon(self) -> None:
        """Shut the connection down (a call still out on it ends at once)."""
        _shut_down(self._fds, self._host_ips, self.address[1])


def call_by(deadline: float, what: str, address: tuple[str, int], fn: Callable[[], T],
             on_late: Callable[[], None]) -> T:
    """`fn()` on a thread of its own; its result or error, or StoreUnanswered at `deadline`
    (after `on_late`). The caller waits in slices of SLICE_S."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            box["error"] = exc
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=call, name=f"store-{what}", daemon=True).start()
    while not done.wait(max(0.0, min(SLICE_S, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            on_late()
            raise StoreUnanswered(f"the store at {address[0]}:{address[1]} did not answer "
                                  f"{what} within {time.monotonic() - started:.1f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def connect(address: tuple[str, int], timeout_s: float, deadline: float) -> Connection:
    """A fresh client connection, by `deadline` (torch's constructor connects, retrying
    for `timeout_s`, then pings: the ping is what blocks against a silent store). Its
    socket is the one to the store that the constructor added: the rank connects to the
    store from one thread, one connection at a time (the sockets there before, an
    abandoned one's included, are left out)."""
    host, port = address
    host_ips = frozenset(info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    before = _sockets_to(host_ips, port)

    def open_one() -> Connection:
        store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        return Connection(store, frozenset(_sockets_to(host_ips, port) - before), address, host_ips)

    def late() -> None:  # the constructor's own socket, found while it blocks in there
        _shut_down(frozenset(_sockets_to(host_ips, port) - before), host_ips, port)

    return call_by(deadline, "a connect", address, open_one, late)


class DeadlineStore:
    """The store calls the runner makes, each bounded: by the deadline given, else by
    `call_timeout_s`. Used from one thread at a time."""

    def __init__(self, address: tuple[str, int], timeout_s: float, call_timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s          # torch's own: how long a connect retries, a wait waits
        self.call_timeout_s = call_timeout_s
        self._conn: Connection | None = None

    def connect(self, deadline: float | None = None) -> Connection:
        """A fresh connection of its own (a process group's, which owns it from then on)."""
        return connect(self.address, self.timeout_s, self._deadline(deadline))

    def _deadline(self, deadline: float | None) -> float:
        return time.monotonic() + self.call_timeout_s if deadline is None else deadline

    def _call(self, what: str, fn: Callable[[dist.TCPStore], T], deadline: float | None) -> T:
        end = self._deadline(deadline)
        if self._conn is None:
            self._conn = self.connect(end)
        conn = self._conn
        try:
            return call_by(end, what, self.address, lambda: fn(conn.store), conn.abandon)
        except StoreUnanswered:
            self._conn = None
            raise

    def close(self) -> None:
        """Shut the connection down (a call still out on it ends at once)."""
        if self._conn is not None:
            self._conn.abandon()
            self._conn = None

    def get(self, key: str, deadline: float | None = None) -> bytes:
        return self._call(f"get {key}", lambda s: s.get(key), deadline)

    def set(self, key: str, value: str, deadline: float | None = None) -> None:
        self._call(f"set {key}", lambda s: s.set(key, value), deadline)

    def add(self, key: str, amount: int, deadline: float | None = None) -> int:
        return self._call(f"add {key}", lambda s: s.add(key, amount), deadline)

    def compare_set(self, key: str, expected: str, desired: str, deadline: float | None = None) -> bytes:
        return self._call(f"compare_set {key}", lambda s: s.compare_set(key, expected, desired), deadline)

    def check(self, keys: Sequence[str], deadline: float | None = None) -> bool:
        return self._call(f"check {','.join(keys)}", lambda s: s.check(list(keys)), deadline)

    def delete_key(self, key: str, deadline: float | None = None) -> bool:
        return self._call(f"delete {key}", lambda s: s.delete_key(key), deadline)

    def wait(self, keys: Sequence[str], timeout_s: float, deadline: float | None = None) -> None:
        """torch's wait (raises when the keys are not there within `timeout_s`), bounded by
        `deadline` or by `timeout_s` plus the call timeout (the cancel it then sends must be
        acknowledged)."""
        end = deadline if deadline is not None else time.monotonic() + timeout_s + self.call_timeout_s
        self._call(f"wait {','.join(keys)}", lambda s: s.wait(list(keys), timedelta(seconds=timeout_s)), end)
