"""A store that stops answering ends a join as a rendezvous failure, by its deadline, and a
reply it sends late is never read as a later call's answer.

Between the rank and a real TCPStore sits a relay that keeps every connection open but
can hold the store's replies (as a paused or partitioned store host does: the kernel
keeps the connection, nothing comes back), then release them; or close a connection, or
answer garbage. The join's store calls are made silent one at a time, in turn.

The same check run against a client that puts a receive timeout on one shared connection
(the obvious fix) must find stale replies: that is what makes this test able to fail.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch.distributed as dist

from harness.job.control import GENERATION_KEY
from harness.job.group import CollectiveError, GlooGroup
from harness.job.store import DeadlineStore, _sockets_to, connect
from tests.harness.test_group import serve_store

pytestmark = pytest.mark.system  # a real TCPStore, a relay and a rank process: not in ./dev.sh check

RENDEZVOUS_S = 1.0
JOIN_CALLS = 6  # get generation, compare_set members, the group's connect, add arrived, set complete, wait


class Relay:
    """127.0.0.1:port -> the store; replies pass, are held, or are replaced by `mode`."""

    def __init__(self, store_port: int) -> None:
        self.store_port = store_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mode = "pass"  # pass | hold | close | garbage
        self._changed = threading.Condition()
        self._sockets: list[socket.socket] = []
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode: str) -> None:
        with self._changed:
            self.mode = mode
            self._changed.notify_all()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.store_port))
            except OSError:  # the store is gone: the test is over
                client.close()
                return
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies:
                    with self._changed:  # a held reply waits here, the connection open
                        self._changed.wait_for(lambda: self.mode != "hold" or self._stopped)
                        mode = self.mode
                    if mode == "close":
                        break
                    if mode == "garbage":
                        data = bytes([0xFF]) * len(data)
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._stopped = True
        self.set("pass")
        self.listener.close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def store_and_relay():
    server, port = serve_store(0)
    relay = Relay(port)
    yield server, relay
    relay.close()


class SharedSocketStore(DeadlineStore):
    """The obvious fix, wrong: one connection for every call, a receive timeout on its
    socket so that a call raises at its deadline; the next call reads whatever comes next."""

    def _call(self, what: str, fn: Callable[[Any], Any], deadline: float | None) -> Any:
        if self._conn is None:
            self._conn = connect(self.address, self.timeout_s, time.monotonic() + 5.0)
            for fd in _sockets_to(frozenset({"127.0.0.1"}), self.address[1]) & self._conn._fds:
                with socket.socket(fileno=os.dup(fd)) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                    (int(self.call_timeout_s)).to_bytes(8, "little") + (0).to_bytes(8, "little"))
        return fn(self._conn.store)


def silent_before(group: GlooGroup, relay: Relay, call: int, mode: str) -> list[str]:
    """Make the relay go `mode` just before the join's store call number `call` (from 0);
    returns the names of the calls made, as they are made."""
    made: list[str] = []
    store = group.store
    plain_call, plain_connect = store._call, store.connect

    def counted(name: str) -> None:
        if len(made) == call:
            relay.set(mode)
        made.append(name)

    def call_(what: str, fn: Callable[[Any], Any], deadline: float | None) -> Any:
        counted(what.split()[0])
        return plain_call(what, fn, deadline)

    def connect_(deadline: float | None = None) -> Any:
        counted("connect")
        return plain_connect(deadline)

    store._call, store.connect = call_, connect_  # type: ignore[method-assign]
    return made


def join_then_retry(relay: Relay, server: dist.TCPStore, call: int, mode: str,
                    store_class: type[DeadlineStore] = DeadlineStore) -> tuple[float, list[str]]:
    """A one-rank join through the relay, silent from call `call`; then the store answers
    again and the rank joins anew as the runner would. Returns how long the failed join
    took and what the retried join read that the store does not hold."""
    group = GlooGroup(("127.0.0.1", relay.port), 0, 1, 1.0, RENDEZVOUS_S, store_timeout_s=5.0)
    group.store = store_class(group.store.address, 5.0, RENDEZVOUS_S)
    made = silent_before(group, relay, call, mode)
    started = time.monotonic()
    with pytest.raises(CollectiveError) as failed:
        group.join(None)
    took = time.monotonic() - started
    assert failed.value.cause == "rendezvous", failed.value
    assert len(made) > call, f"the join made {made}, not call {call}"
    relay.set("pass")
    time.sleep(0.2)  # the held replies reach whatever connection they were sent on
    wrong: list[str] = []
    try:
        gen = group.join(group.generation if group.generation >= 0 else None)
    except CollectiveError as exc:
        return took, [f"the retried join failed: {exc}"]
    finally:
        group.leave()
    if gen != int(server.get(GENERATION_KEY)):
        wrong.append(f"generation {gen}, the store's {server.get(GENERATION_KEY)}")
    if list(group.members) != json.loads(server.get(f"gen{gen}/members")):
        wrong.append(f"members {group.members}, the store's {server.get(f'gen{gen}/members')}")
    if server.add(f"gen{gen}/arrived", 0) != 1:
        wrong.append(f"arrived {server.add(f'gen{gen}/arrived', 0)} in generation {gen}, expected 1")
    return took, wrong


@pytest.mark.parametrize("call", range(JOIN_CALLS))
def test_a_join_whose_store_falls_silent_fails_by_its_deadline_and_reads_no_stale_reply(store_and_relay, call):
    server, relay = store_and_relay
    took, wrong = join_then_retry(relay, server, call, "hold")
    assert took <= RENDEZVOUS_S + 1.0
    assert wrong == []


@pytest.mark.parametrize("mode", ["close", "garbage"])
def test_a_store_that_closes_or_answers_garbage_is_a_rendezvous_failure(store_and_relay, mode):
    server, relay = store_and_relay
    group = GlooGroup(("127.0.0.1", relay.port), 0, 1, 1.0, RENDEZVOUS_S, store_timeout_s=5.0)
    silent_before(group, relay, 1, mode)
    started = time.monotonic()
    with pytest.raises(CollectiveError) as failed:
        group.join(None)
    assert failed.value.cause == "rendezvous" and time.monotonic() - started <= RENDEZVOUS_S + 1.0


def test_a_receive_timeout_on_one_shared_connection_reads_stale_replies(store_and_relay):
    """The check above, against the obvious fix: it must find what that fix gets wrong."""
    server, relay = store_and_relay
    _, wrong = join_then_retry(relay, server, 1, "hold", SharedSocketStore)
    assert wrong != []


SIGTERM_DURING_A_SILENT_CALL = """
import os, signal, sys, threading, time
from harness import signals
from harness.job.group import GlooGroup
from tests.harness.test_group import serve_store
from tests.harness.test_store_silence import Relay, silent_before
signals.install()
server, port = serve_store(0)
relay = Relay(port)
group = GlooGroup(("127.0.0.1", relay.port), 0, 1, 1.0, 30.0, store_timeout_s=5.0)
silent_before(group, relay, 1, "hold")
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
started = time.monotonic()
try:
    group.join(None)
except signals.Terminated:
    print(f"terminated after {time.monotonic() - started:.2f}", flush=True)
    os._exit(0)
os._exit(1)
"""


def test_a_sigterm_ends_a_silent_store_call_within_a_slice():
    """A rank told to stop while its store call waits on a silent store stops (torch's own
    read retries on EINTR: a call made on this thread would not)."""
    done = subprocess.run([sys.executable, "-c", SIGTERM_DURING_A_SILENT_CALL], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    after = float(done.stdout.split()[-1])
    assert 1.0 <= after <= 1.3
