"""`GlooGroup` against a real TCPStore on loopback: the rejoin protocol (store operations
only; tests/harness/test_detector_job.py runs it in the 16-rank job), and waiting on a real
two-rank gloo group's collectives."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness.job.control import GENERATION_KEY, heartbeat_server
from harness.job.detector import HeartbeatClient
from harness.job.group import CollectiveError, GlooGroup, gloo_environment
from tests.harness.test_detector import wait_for

pytestmark = pytest.mark.system  # real gloo groups and a TCPStore on loopback: not in ./dev.sh check


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_store(generation: int) -> tuple[dist.TCPStore, int]:
    """A control plane's store on loopback at `generation`, and its port."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))
    master.set(GENERATION_KEY, str(generation))
    return master, port


@pytest.fixture
def store():
    master, port = serve_store(3)
    master.set("gen3/members", json.dumps([0, 1, 3]))  # rank 2 was left out
    return master, port


def group_of(port: int, member: int, members: tuple[int, ...]) -> GlooGroup:
    group = GlooGroup(("127.0.0.1", port), member, 4, 5.0, 5.0, store_timeout_s=5.0)
    group.generation, group.members = 3, members
    group.rank, group.world_size = (members.index(member) if member in members else 0), len(members)
    return group


def test_a_rank_asks_rank_0_admits_it_and_it_finds_the_generation_that_has_it(store):
    _, port = store
    leader, outsider = group_of(port, 0, (0, 1, 3)), group_of(port, 2, (0, 1, 2, 3))
    assert leader.rejoin_requests() == () and outsider.admitted() is None
    outsider.ask_to_rejoin()
    assert leader.rejoin_requests() == (2,)
    assert leader.rejoin_requests() == ()  # the counter has not moved since
    assert leader.admit((2,)) == (0, 1, 2, 3)
    assert outsider.admitted() == (4, (0, 1, 2, 3))
    # the request is withdrawn: asking again later is a new request
    outsider.ask_to_rejoin()
    assert leader.rejoin_requests() == (2,)


def test_admission_loses_to_a_proposal_that_came_first(store):
    master, port = store
    leader, outsider = group_of(port, 0, (0, 1, 3)), group_of(port, 2, (0, 1, 2, 3))
    master.set("gen4/members", json.dumps([0, 3]))  # a failure's proposal won generation 4
    outsider.ask_to_rejoin()
    assert leader.admit(leader.rejoin_requests()) == (0, 3)
    assert outsider.admitted() is None


def test_members_are_not_asking(store):
    _, port = store
    leader, member = group_of(port, 0, (0, 1, 3)), group_of(port, 1, (0, 1, 3))
    member.ask_to_rejoin()  # a member's stale request (it is in): nobody to admit
    assert leader.rejoin_requests() == ()


def test_a_store_that_is_gone_is_a_collective_error():
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))
    outsider = group_of(port, 2, (0, 1, 2, 3))
    del master  # the control plane goes away
    with pytest.raises(CollectiveError, match="ask to rejoin") as caught:
        outsider.ask_to_rejoin()
    assert caught.value.phase == "rejoin"


class Work:
    """A pending op that completes when `done` is set (by the watch, in these tests)."""

    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True


def test_an_op_that_completed_while_the_watch_spoke_is_not_abandoned(store):
    _, port = store
    group, work = group_of(port, 0, (0, 1, 3)), Work()
    group._pg = object()

    spoke = []

    def watch(waited_s):  # the op ends while this rank reads a digest saying a peer moved on
        work.done = True
        spoke.append(waited_s)
        return "rank 1 has moved to a newer generation"
    group._wait(lambda: work, watch)  # returns: the op is done, nothing to leave
    assert len(spoke) == 1 and group._pending is None


def test_an_op_still_pending_when_the_watch_speaks_is_abandoned(store):
    _, port = store
    group, work = group_of(port, 0, (0, 1, 3)), Work()
    group._pg = object()
    with pytest.raises(CollectiveError, match="silent") as caught:
        group._wait(lambda: work, lambda waited_s: "rank 1 silent for 0.80s")
    assert caught.value.cause == "suspect" and group._pending is work  # left for the reaper


def two_rank_gloo(timeout_s: float) -> tuple[GlooGroup, GlooGroup]:
    """Ranks 0 and 1 of one real gloo group, both in this process."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))
    master.set(GENERATION_KEY, "0")
    groups = [GlooGroup(("127.0.0.1", port), r, 2, timeout_s, 5.0) for r in (0, 1)]
    groups[0].server = master  # serves as long as the groups are used
    joining = threading.Thread(target=groups[1].join, args=(None,))
    joining.start()
    groups[0].join(None)
    joining.join()
    return groups[0], groups[1]


def test_a_collective_that_outlasts_many_wait_slices_completes():
    first, late = two_rank_gloo(timeout_s=5.0)
    ones = torch.ones(3)

    def late_all_reduce():  # ten wait slices after rank 0 issued its op
        time.sleep(10 * 0.02)
        late.all_reduce(torch.ones(3))
    joining = threading.Thread(target=late_all_reduce)
    joining.start()
    first.all_reduce(ones)
    joining.join()
    assert ones.tolist() == [2.0, 2.0, 2.0]
    first.leave(), late.leave()


def test_a_collective_that_times_out_fails_at_the_group_timeout_not_at_a_slice():
    first, silent = two_rank_gloo(timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(CollectiveError) as caught:
        first.all_reduce(torch.ones(3))  # rank 1 never issues its op
    assert caught.value.cause == "timeout" and time.monotonic() - started >= 0.9
    first.leave(), silent.leave()


def test_the_control_planes_digest_tells_the_members_a_rank_asked_back(store):
    """The store's rejoin counter reaches the members in the digest, as the control plane
    serves it, so they need not wait for group rank 0's next step to hear of a request."""
    master, port = store
    hb_port = free_port()
    server = heartbeat_server(hb_port, master, host="127.0.0.1").start()
    member = HeartbeatClient(("127.0.0.1", hb_port), 0, 0.05, lambda: 3).start()
    try:
        assert wait_for(lambda: (v := member.view()) is not None and v).asks == 0
        group_of(port, 2, (0, 1, 3)).ask_to_rejoin()
        assert wait_for(lambda: member.view().asks == 1)
    finally:
        member.stop()
        server.stop()


def established_sockets(store_port: int) -> set[str]:
    """The inodes of this process's established TCP sockets that are not the store's."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if (target := os.readlink(f"/proc/self/fd/{fd}")).startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            ports = {int(fields[i].rsplit(":", 1)[1], 16) for i in (1, 2)}
            if fields[3] == "01" and fields[9] in inodes and store_port not in ports:
                found.add(fields[9])
    return found


@pytest.mark.parametrize("lazy_init, pairs", [(False, 6), (True, 4)])
def test_a_lazy_group_connects_only_the_pairs_its_collectives_use(monkeypatch, lazy_init, pairs):
    """Four real gloo ranks, one all-reduce: every pair connected as the group forms (4 x 3 / 2),
    or with lazy init only the ring's neighbours."""
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0" if lazy_init else "1")  # the scenario decides, not this
    for name, value in gloo_environment("lo", lazy_init).items():
        monkeypatch.setenv(name, value)
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))
    master.set(GENERATION_KEY, "0")
    groups = [GlooGroup(("127.0.0.1", port), r, 4, 5.0, 5.0) for r in range(4)]
    sums = [torch.ones(3) for _ in groups]
    earlier = established_sockets(port)  # other tests' groups in this process

    def join_and_reduce(r: int) -> None:
        groups[r].join(None)
        groups[r].all_reduce(sums[r])
    threads = [threading.Thread(target=join_and_reduce, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [s.tolist() for s in sums] == [[4.0, 4.0, 4.0]] * 4
    # both ends of each pair live in this process
    assert len(established_sockets(port) - earlier) == 2 * pairs
    for group in groups:
        group.leave()
