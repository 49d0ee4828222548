"""The world's generation the hook agrees on (harness.job.hook.world_generation), against a
real TCPStore: the largest restart count once every process raised it, and never a wait past
the deadline, whatever the store does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from harness.job.hook.world_generation import agree
from tests.byo.test_hook import free_port

SERVER = ("import sys, time, torch.distributed as d; s = d.TCPStore('127.0.0.1', int(sys.argv[1]), 1, True, "
          "wait_for_workers=False); print('up', flush=True); time.sleep(120)")


def store_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert server.stdout.readline().strip() == "up"
    return server


def agree_all(port: int, counts: list[int], deadline_s: float) -> list[int | None]:
    found: list[int | None] = [None] * len(counts)

    def one(i: int) -> None:
        found[i] = agree("127.0.0.1", port, len(counts), counts[i], deadline_s)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(counts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


def test_a_world_of_restarted_and_relaunched_workers_agrees_on_the_largest_count():
    port = free_port()
    server = store_server(port)
    try:
        # three survivors restarted once; the host that was killed and started again counts 0
        assert agree_all(port, [1, 0, 1, 1], 10.0) == [1, 1, 1, 1]
    finally:
        server.kill()
        server.wait()


def test_a_world_that_does_not_all_arrive_keeps_its_own_counts_at_the_deadline():
    port = free_port()
    server = store_server(port)
    try:
        began = time.monotonic()
        assert agree("127.0.0.1", port, 2, 3, 0.5) is None  # its peer never came
        assert time.monotonic() - began < 1.5
    finally:
        server.kill()
        server.wait()


def test_a_store_that_stops_answering_holds_the_process_no_longer_than_the_deadline():
    port = free_port()
    server = store_server(port)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert agree("127.0.0.1", port, 2, 1, 1.0) is None
        assert time.monotonic() - began < 2.0
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
