"""The torch.distributed edge: a gloo process group that can be left and re-joined.

torch raises plain RuntimeErrors (and DistError subclasses) for every collective failure;
they are translated once, here, into `CollectiveError` with a short classification.
Collectives are issued asynchronously and waited on in slices of WATCH_INTERVAL_S, so that
a SIGTERM is noticed within one slice and a `watch` (the failure detector) is asked after
each whether to stop waiting. Its completion is polled every POLL_INTERVAL_S (an NCCL
op's `wait()` only orders the CUDA stream; for gloo, polling was measured faster than
waiting inside torch: docs/scale-journal.md).

Each generation is its own `ProcessGroupGloo` object (not the default group), so a group
whose collective is stuck can be abandoned: gloo has no abort (`abort()` and `shutdown()`
return but the pending op runs on, measured), and dropping the last reference blocks in
its destructor until the op's timeout. `leave()` therefore hands such a group to a reaper
thread, which drops it there (torch releases the GIL in that destructor): its threads end
and its sockets close at the collective timeout, while this rank forms the next
generation on a fresh store prefix at once.

Every store call is bounded (harness.job.store): the join as a whole by the rendezvous
timeout, so a store that stops answering (its host gone, paused or cut off, or this
rank's own link down) ends the join as a rendezvous failure the policy handles, never a
wait without end. Each generation's group talks to the store over a connection of its own,
shut down when the group is left: a group still forming or connecting against a silent
store is abandoned with it, and the rank's other calls never queue behind it.

Membership: generation N's members (original rank ids) are agreed under `gen<N>/members`
by compare-and-set from the empty value: the first proposal wins and every rank reads it.
Ranks are renumbered by their position in it.

Rejoin: a rank left out asks under ``rejoin/<rank>`` and counts itself in under
``rejoin/requests``; group rank 0 reads that counter at each step's start and, when it
moved, agrees the next generation's members (the current ones and those asking) before the
others move there; the rank asking watches for a generation whose members include it.
(The control plane's digest carries the counter too, so the members cut their pacing
sleep short and that step starts at once.)
"""
from __future__ import annotations

import contextlib
import gc
import json
import re
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterator, Protocol

import torch
import torch.distributed as dist

from harness.job.control import GENERATION_KEY, REJOIN_REQUESTS_KEY
from harness.job.store import Connection, DeadlineStore, StoreUnanswered, call_by

POLL_INTERVAL_S = 0.005
WATCH_INTERVAL_S = 0.02
RENDEZVOUS_SLICE_S = 0.5
WATCHED_RENDEZVOUS_SLICE_S = 0.05
RENDEZVOUS_REPORT_S = 5.0
# A store call that ends a join may run this long past the join's deadline: a wait's cancel
# acknowledged, or the generation bumped after a rendezvous that timed out.
STORE_GRACE_S = 0.4
# A collective's error is gloo's to raise at the group's timeout; past this much more, the
# op is abandoned as timed out (a lazily connected pair waits on the store, unbounded).
COLLECTIVE_GRACE_S = 2.0
_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


# Asked while waiting, with the seconds waited so far: a reason to stop waiting, or None.
Watch = Callable[[float], "str | None"]


class CollectiveError(Exception):
    """A collective or a rendezvous failed, or a watch ended the wait. `cause` is timeout /
    closed / reset / rendezvous / suspect (the failure detector) / other."""

    def __init__(self, message: str, cause: str, phase: str) -> None:
        super().__init__(message)
        self.cause = cause
        self.phase = phase


def classify(message: str) -> str:
    text = message.lower()
    if "ncclremoteerror" in text or "remote process exited" in text:
        return "remote"  # NCCL: a peer's process or the network failed
    if "connection closed by peer" in text:
        return "closed"
    if "reset by peer" in text:
        return "reset"
    if "timed out" in text or "timeout" in text:
        return "timeout"
    if "broken pipe" in text:
        return "closed"
    return "other"


@contextlib.contextmanager
def _store_errors(what: str) -> Iterator[None]:
    try:
        yield
    except (RuntimeError, ValueError) as exc:  # DistStoreError derives from RuntimeError
        raise CollectiveError(f"{what}: {_short(exc)}", "rendezvous", "rejoin") from exc


def _short(exc: BaseException) -> str:
    # gloo prefixes its messages with the C++ source location: keep the words.
    return re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", str(exc)).strip().splitlines()[0][:300]


class NotAMember(Exception):
    """The agreed membership of a generation leaves this rank out."""

    def __init__(self, generation: int, members: tuple[int, ...]) -> None:
        super().__init__(f"generation {generation} goes on without this rank "
                         f"(members {list(members)})")
        self.generation = generation
        self.members = members


class Group(Protocol):
    """What the runner needs of a process group (a fake implements it in unit tests)."""

    generation: int
    rank: int                   # position in `members`
    world_size: int
    member: int                 # this rank's original id (the events' rank)
    members: tuple[int, ...]    # original ids of the current generation, in rank order

    def join(self, failed_generation: int | None, proposal: tuple[int, ...] | None = None,
             watch: Watch | None = None) -> int: ...
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", watch: Watch | None = None) -> None: ...
    def broadcast(self, tensor: torch.Tensor, src: int, watch: Watch | None = None) -> None: ...
    def leave(self) -> float: ...
    def health_check(self, timeout_s: float) -> tuple[bool, str]: ...
    def ask_to_rejoin(self) -> None: ...
    def admitted(self) -> tuple[int, tuple[int, ...]] | None: ...
    def rejoin_requests(self) -> tuple[int, ...]: ...
    def admit(self, ranks: tuple[int, ...]) -> tuple[int, ...]: ...


def gloo_environment(ifname: str, lazy_init: bool) -> dict[str, str]:
    """What a rank's process sets before its first gloo group: the link gloo binds to, and
    whether a group connects every pair of ranks as it forms (torch's default; a 64-rank
    group is 2,016 connections) or each pair at its first collective (a ring's all-reduce
    needs two per rank). docs/scale-journal.md measures the difference. Both are set, so that the
    harness's environment does not decide what the scenario says."""
    return {"GLOO_SOCKET_IFNAME": ifname, "TORCH_GLOO_LAZY_INIT": "1" if lazy_init else "0"}


def new_process_group(comm: str, store: dist.Store, rank: int, size: int, timeout: timedelta) -> Any:
    """One generation's group: gloo (CPU or CUDA tensors) or NCCL (CUDA tensors; the rank's
    environment, harness.job.device.rank_env, keeps it on the rank's link)."""
    if comm == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class GlooGroup:
    """One process group per generation under one store (gloo, or NCCL with `comm`)."""

    def __init__(self, store_address: tuple[str, int], rank: int,
                 world_size: int, timeout_s: float, rendezvous_timeout_s: float,
                 on_wait: Callable[[int, int], None] = lambda gen, arrived: None,
                 on_reaped: Callable[[int, float], None] = lambda gen, secs: None, comm: str = "gloo",
                 store_timeout_s: float = 60.0) -> None:
        self.comm = comm
        # calls outside a join (the rejoin paths) are bounded by the rendezvous timeout too
        self.store = DeadlineStore(store_address, store_timeout_s, rendezvous_timeout_s)
        self.store_address = store_address
        self.member = rank
        self.members = tuple(range(world_size))
        self.everyone = self.members  # the job's ranks: the only ones that may ask to rejoin
        self.rank = rank
        self.world_size = world_size
        self.timeout = timedelta(seconds=timeout_s)
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.on_wait = on_wait      # called while waiting in a rendezvous: (generation, arrived)
        self.on_reaped = on_reaped  # called by the reaper: (generation, seconds it lingered)
        self.generation = -1
        self._pg: Any = None        # the ProcessGroupGloo of `generation`
        self._pg_store: Connection | None = None  # its own connection to the store
        self._pending: Any = None   # its work not yet completed, if a wait was abandoned
        self._requests_seen = 0     # rejoin/requests when group rank 0 last found some

    def join(self, failed_generation: int | None, proposal: tuple[int, ...] | None = None,
             watch: Watch | None = None) -> int:
        """Join the current generation; after a failure in generation g, move past g.

        The members are agreed first (`proposal`, default: the current members, unless
        another rank proposed first). Then the rendezvous: every member counts itself in
        under ``gen<N>/arrived`` and waits, up to the rendezvous timeout (or until `watch`
        gives a reason), until all have arrived; only then is the gloo group formed. A rank
        whose rendezvous fails bumps the generation, so that late ranks never count into a
        generation the others left. Raises NotAMember when the agreed members exclude it.

        The whole join is bounded by the rendezvous timeout (store calls, each ending within
        STORE_GRACE_S of it), except that the group, once every member arrived, gets the
        store timeout to form: what torch gives gloo's reads of a store that answers. Its
        connection is opened before the rendezvous, as each member arrives, not by all
        members at once when the last one does (a burst a loaded store is slow to accept).
        """
        started = time.monotonic()
        deadline = started + self.rendezvous_timeout_s
        try:
            if failed_generation is None:
                gen = int(self.store.get(GENERATION_KEY, deadline))
            else:
                old, new = str(failed_generation), str(failed_generation + 1)
                gen = int(self.store.compare_set(GENERATION_KEY, old, new, deadline))
            self.generation = gen
            members = self._agree(gen, self.members if proposal is None else proposal, deadline)
            if self.member not in members:
                raise NotAMember(gen, members)
            self.members, self.rank, self.world_size = members, members.index(self.member), len(members)
            conn = self.store.connect(deadline)
            try:
                stopped = self._rendezvous(gen, watch, started, deadline)
                if stopped is not None:
                    self._bump_past(gen)
                    cause, reason = stopped
                    raise CollectiveError(reason, cause, "join")
                self._form(gen, conn, max(deadline, time.monotonic() + self.store.timeout_s))
            except BaseException:
                conn.abandon()
                raise
        except (RuntimeError, ValueError) as exc:  # DistError and StoreUnanswered derive from RuntimeError
            raise CollectiveError(_short(exc), "rendezvous", "join") from exc
        return self.generation

    def _bump_past(self, gen: int) -> None:
        """Move the generation past `gen`, so that late ranks never count into it. A store
        that does not answer is let be: the next join bumps from `gen` itself."""
        try:
            self.store.compare_set(GENERATION_KEY, str(gen), str(gen + 1), time.monotonic() + STORE_GRACE_S)
        except StoreUnanswered:
            pass

    def _form(self, gen: int, conn: Connection, deadline: float) -> None:
        """This generation's group, over its own store connection `conn`, formed by `deadline`."""
        self._pg = call_by(deadline, "forming the group", self.store_address,
                           lambda: new_process_group(self.comm, dist.PrefixStore(f"gen{gen}/", conn.store),
                                                     self.rank, self.world_size, self.timeout),
                           conn.abandon)
        self._pg_store = conn

    def _agree(self, gen: int, proposal: tuple[int, ...], deadline: float | None = None) -> tuple[int, ...]:
        agreed = self.store.compare_set(f"gen{gen}/members", "", json.dumps(sorted(proposal)), deadline)
        return tuple(json.loads(agreed))

    def _rendezvous(self, gen: int, watch: Watch | None, started: float, deadline: float
                    ) -> tuple[str, str] | None:
        """Wait until every member arrived, up to `deadline`; returns (cause, reason) if it
        stopped waiting. Raises StoreUnanswered for a store that stopped answering."""
        complete, arrived_key = f"gen{gen}/complete", f"gen{gen}/arrived"
        arrived = self.store.add(arrived_key, 1, deadline)
        if arrived == self.world_size:
            self.store.set(complete, "1", deadline)
        slice_s = RENDEZVOUS_SLICE_S if watch is None else WATCHED_RENDEZVOUS_SLICE_S
        next_report = 0.0
        while (left := deadline - time.monotonic()) > 0:
            if time.monotonic() >= next_report:  # a rank waiting here is acting, not hung
                self.on_wait(gen, arrived)
                next_report = time.monotonic() + RENDEZVOUS_REPORT_S
            try:  # waits in slices so that a SIGTERM (and the watch) is handled within one
                self.store.wait([complete], min(left, slice_s), deadline + STORE_GRACE_S)
                return None
            except StoreUnanswered:
                raise
            except RuntimeError:  # not complete within the slice
                arrived = self.store.add(arrived_key, 0, deadline + STORE_GRACE_S)
            if watch is not None and (reason := watch(time.monotonic() - started)) is not None:
                return "suspect", reason
        return "rendezvous", (f"rendezvous of generation {gen} timed out after "
                              f"{self.rendezvous_timeout_s:g}s waiting for {self.world_size} ranks")

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", watch: Watch | None = None) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = _OPS[op]
        with self._staged(tensor) as staged:
            self._wait(lambda: self._pg.allreduce([staged], options), watch)

    def broadcast(self, tensor: torch.Tensor, src: int, watch: Watch | None = None) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        with self._staged(tensor) as staged:
            self._wait(lambda: self._pg.broadcast([staged], options), watch)

    @contextlib.contextmanager
    def _staged(self, tensor: torch.Tensor) -> Iterator[torch.Tensor]:
        """`tensor` where the backend reduces it: NCCL takes only CUDA tensors (the restore
        agreement's counters live on the CPU), gloo either."""
        if self.comm != "nccl" or tensor.is_cuda:
            yield tensor
            return
        staged = tensor.cuda()
        yield staged
        tensor.copy_(staged.cpu())

    def _wait(self, issue: Callable[[], Any], watch: Watch | None) -> None:
        """Issue a collective and poll it; a watch's reason abandons it (left pending)."""
        if self._pg is None:
            raise CollectiveError("no process group: join first", "other", "step")
        started = time.monotonic()
        deadline = started + self.timeout.total_seconds() + COLLECTIVE_GRACE_S
        try:
            work = self._pending = issue()
            while not self._completed_within(work, WATCH_INTERVAL_S):
                if watch is not None and (reason := watch(time.monotonic() - started)) is not None:
                    # a rank descheduled past its op's end would otherwise abandon a finished
                    # op (a member that moved on after it reads as "a newer generation")
                    if not work.is_completed():
                        raise CollectiveError(reason, "suspect", "step")
                if time.monotonic() >= deadline and not work.is_completed():
                    raise CollectiveError(f"no end of the collective {time.monotonic() - started:.1f} s after "
                                          f"it started (group timeout {self.timeout.total_seconds():g} s)",
                                          "timeout", "step")
            work.wait()
            self._pending = None
        except RuntimeError as exc:
            self._pending = None  # a failed op is over: nothing left to abandon
            raise CollectiveError(_short(exc), classify(str(exc)), "step") from exc

    @staticmethod
    def _completed_within(work: Any, seconds: float) -> bool:
        """Whether `work` ended (done or failed) within `seconds`, polled. Waiting inside
        torch instead (`Work.wait(timeout)` in slices, which raises at each slice's end)
        made 64 ranks' steps on 2 cores slower: a median of 0.335-0.338 s against
        0.304-0.327 s polling, four rounds (docs/scale-journal.md)."""
        deadline = time.monotonic() + seconds
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        return work.is_completed()

    def leave(self) -> float:
        """Release the group so its sockets close and peers see it; returns seconds taken.

        Never waits for the group to go: NCCL aborts the communicator (its pending op ends
        now); gloo, which has no abort, destroys the group on a thread of its own, a reaper:
        a group with a pending op goes when the op times out, any other at once. Even then
        closing its pairs took 0.02-0.15 s per rank with 16 ranks on 2 cores, which the next
        rendezvous used to wait for (docs/scale-journal.md)."""
        start = time.monotonic()
        gc.collect()  # first, while we still hold them: tracebacks hold the work and the group
        lingering = [self._pg, self._pending]
        self._pg = self._pending = None  # the reaper must hold the last references
        if self._pg_store is not None:  # whatever of the group still waits on the store ends now
            self._pg_store.abandon()
            self._pg_store = None
        if self.comm == "nccl" and lingering[0] is not None:
            lingering[0].abort()
            lingering.clear()
        elif lingering[0] is not None:
            stuck = lingering[1] is not None and not lingering[1].is_completed()
            threading.Thread(target=self._reap, args=(lingering, self.generation, stuck),
                             name=f"reaper-gen{self.generation}", daemon=True).start()
        return time.monotonic() - start

    def _reap(self, lingering: list[Any], gen: int, stuck: bool) -> None:
        start = time.monotonic()
        lingering.clear()  # the destructor waits for an abandoned op to time out
        if stuck:
            self.on_reaped(gen, time.monotonic() - start)

    # -- rejoin ------------------------------------------------------------------------------

    def ask_to_rejoin(self) -> None:
        """Ask the members to let this rank (not one of them now) in at their next generation."""
        with _store_errors("ask to rejoin"):
            self.store.set(f"rejoin/{self.member}", "1")
            self.store.add(REJOIN_REQUESTS_KEY, 1)  # after the key: whoever sees the count sees it

    def admitted(self) -> tuple[int, tuple[int, ...]] | None:
        """The generation whose agreed members include this rank (the current one, or the
        next one group rank 0 agreed ahead), and those members; withdraws the request."""
        with _store_errors("wait to rejoin"):
            current = int(self.store.get(GENERATION_KEY))
            for gen in (current, current + 1):
                key = f"gen{gen}/members"
                if self.store.check([key]):
                    members = tuple(json.loads(self.store.get(key)))
                    if self.member in members:
                        self.store.delete_key(f"rejoin/{self.member}")
                        return gen, members
        return None

    def rejoin_requests(self) -> tuple[int, ...]:
        """Ranks outside the members that asked to rejoin; () at once (one store round trip)
        while the request counter has not moved since requests were last found."""
        with _store_errors("read rejoin requests"):
            count = self.store.add(REJOIN_REQUESTS_KEY, 0)
            if count == self._requests_seen:
                return ()
            self._requests_seen = count
            return tuple(r for r in self.everyone
                         if r not in self.members and self.store.check([f"rejoin/{r}"]))

    def admit(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """Agree the next generation's members ahead: the current ones and `ranks`. Returns
        what was agreed (another rank's proposal wins if a failure got there first)."""
        with _store_errors("admit"):
            return self._agree(self.generation + 1, self.members + tuple(ranks))

    def health_check(self, timeout_s: float) -> tuple[bool, str]:
        """Can this host reach the control plane? A TCP connect within `timeout_s`."""
        try:
            with socket.create_connection(self.store_address, timeout=timeout_s):
                return True, "control plane reachable"
        except OSError as exc:
            return False, f"control plane unreachable: {exc.strerror or exc}"
