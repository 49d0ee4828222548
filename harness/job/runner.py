"""The fault-tolerant runner: the document's `DistributedFaultTolerantRunner`, done right.

    run step ── ok ──> advance, checkpoint every K steps
        └─ collective failed ─> release the group (outside the except block, so no
           traceback keeps its sockets open) ─> retries left?
              no  ─> breaker? open it : fail fast ─> free accelerator memory, exit
              yes ─> backoff base*2^n (capped) + jitter ─> health check
                        fail ─> breaker? open it : count the try, back off again
                        pass ─> join the next generation ─> restore the checkpoint
                                all ranks agree on (min over ranks) ─> run step

With a failure detector (policy `detector`), every wait (a collective, a rendezvous of an
elastic policy, the pacing sleep between steps) asks it every few tens of milliseconds
whether a member is suspect; if so the wait ends at once (the stuck collective is
abandoned to a reaper: see harness.job.group) and recovery starts, without waiting for the
collective timeout. The health check is then "digests arrive from the control plane".
An elastic policy also decides the next membership:

    suspect members ─> wait up to exclude_after for the silent ones to speak again
       (a rank whose process is gone is left out at once) ─> propose the others
       ─> the first proposal of the generation wins (control plane) ─> left out? open the
       breaker and leave : renumber, restore the newest in-memory state of a peer, go on

With `rejoin`, a rank whose breaker opened frees what it holds but stays:

    breaker open ─> release group and accelerator memory ─> digests arrive again?
       ─> ask to rejoin ─> group rank 0 sees the request at its next step, agrees the
       next generation's members (the current ones and this rank) and sets a flag in that
       step's gradient all-reduce ─> after that same step every member moves there, the
       rank joins it, and all take the newest in-memory state ─> the breaker closes
       (nobody let it in within rejoin_within: it leaves as without rejoin)

The runner depends only on the `Group` protocol, an event recorder, a sleep function, a
clock, a seeded RNG and the detector's verdicts, so its retry/backoff/breaker/membership
logic is unit-tested with fakes and the same code runs against real gloo groups in the job.
"""
from __future__ import annotations

import enum
import functools
import io
import random
import time
from typing import Any, Callable

import torch

from harness.job.checkpoint import Checkpointer
from harness.job.detector import FailureDetector
from runfolder.events import EventRecorder
from harness.job.group import CollectiveError, Group, NotAMember
from harness.job.policies import PolicySpec
from harness.job.workload import Workload

PACE_SLICE_S = 0.02      # the pacing sleep asks the detector this often
MEMBERSHIP_POLL_S = 0.05  # while waiting for a silent member to speak again


class Outcome(enum.Enum):
    STOPPED = "stopped"                       # reached max_steps
    FAILED_FAST = "failed-fast"               # gave up at the first failure (timeout policy)
    RETRIES_EXHAUSTED = "retries-exhausted"   # retry policy ran out of tries
    ISOLATED = "isolated"                     # the breaker opened


EXIT_CODES = {Outcome.STOPPED: 0, Outcome.FAILED_FAST: 3, Outcome.RETRIES_EXHAUSTED: 4,
              Outcome.ISOLATED: 5}


def free_accelerator_memory(cuda: Any = torch.cuda) -> dict[str, int | None]:
    """Hand cached accelerator memory back (`empty_cache`); measured before and after with
    the allocator (reserved) and the driver (free, of mem_get_info). None without CUDA."""
    if not cuda.is_available():
        return {"cuda_reserved_before": None, "cuda_reserved_after": None,
                "cuda_free_before": None, "cuda_free_after": None}
    reserved_before, (free_before, _) = cuda.memory_reserved(), cuda.mem_get_info()
    cuda.empty_cache()
    reserved_after, (free_after, _) = cuda.memory_reserved(), cuda.mem_get_info()
    return {"cuda_reserved_before": reserved_before, "cuda_reserved_after": reserved_after,
            "cuda_free_before": free_before, "cuda_free_after": free_after}


class FaultTolerantRunner:
    def __init__(self, policy: PolicySpec, group: Group, workload: Workload,
                 checkpoints: Checkpointer, recorder: EventRecorder, rng: random.Random,
                 sleep: Callable[[float], None] = time.sleep,
                 detector: FailureDetector | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 free_accelerator: Callable[[], dict[str, int | None]] = free_accelerator_memory) -> None:
        self.policy = policy
        self.group = group
        self.workload = workload
        self.checkpoints = checkpoints
        self.recorder = recorder
        self.rng = rng
        self.sleep = sleep
        self.detector = detector if policy.detector is not None else None
        self.clock = clock
        self.free_accelerator = free_accelerator
        self._watch = self._consult if self.detector is not None else None
        self._reported: set[tuple[Any, ...]] = set()   # suspect / straggler events already written
        self._suspected_at: dict[int, float] = {}       # member -> when this rank first suspected it
        self._regroup = False  # rejoin: every member moves to the next generation after this step

    # -- the loop ------------------------------------------------------------------------

    def run(self, max_steps: int | None = None) -> Outcome:
        failure = self._join(None)
        while True:
            if failure is not None:
                outcome = self._recover(failure)
                if outcome is not None:
                    return outcome
                failure = None
            if max_steps is not None and self.workload.step >= max_steps:
                return Outcome.STOPPED
            failure = self._step()

    def _step(self) -> tuple[int, str] | None:
        """One paced training step; returns (generation, error) if a collective failed."""
        started = self.clock()
        step, gen = self.workload.step, self.group.generation
        reduce = functools.partial(self.group.all_reduce, watch=self._watch)
        try:
            if self.policy.rejoin:
                reduce = functools.partial(self._reduce_and_tell, reduce, self._admission())
            loss = self.workload.train_step(reduce, self.group.world_size)
        except CollectiveError as exc:
            if not self.policy.catch_errors:
                self._record_error(exc, step, gen)
                raise
            self._record_error(exc, step, gen)
            return gen, str(exc)
        self.recorder.emit("step", step=step, gen=gen, loss=round(loss, 5),
                           dur=round(self.clock() - started, 4))
        if self.group.rank == 0 and self.workload.step % self.workload.spec.checkpoint_every == 0:
            self.checkpoints.save(self.workload.step, self.workload.state())
            self.recorder.emit("checkpoint", step=self.workload.step)
        if self._regroup:
            return self._move_on(gen)
        return self._pace(started + self.workload.spec.step_period)

    def _admission(self) -> bool:
        """Group rank 0: ranks asking to rejoin? Agree the next generation with them in."""
        if self.group.rank != 0 or not (asking := self.group.rejoin_requests()):
            return False
        admitted = sorted(set(self.group.admit(asking)) & set(asking))
        if admitted:
            self.recorder.emit("admit", peers=admitted, gen=self.group.generation + 1)
        return bool(admitted)

    def _reduce_and_tell(self, reduce: Callable[[torch.Tensor], None], admitting: bool,
                         flat: torch.Tensor) -> None:
        """The gradient all-reduce with one more element, non-zero when group rank 0 admits
        ranks: every member learns it from the same step, so all move on after it."""
        buffer = torch.cat([flat, flat.new_tensor([1.0 if admitting else 0.0])])
        reduce(buffer)
        flat.copy_(buffer[:-1])
        self._regroup = bool(buffer[-1].item() > 0)

    def _move_on(self, gen: int) -> tuple[int, str] | None:
        """To the next generation, whose members group rank 0 agreed (ranks rejoining)."""
        self._regroup = False
        self._release()
        try:
            return self._join(gen)
        except NotAMember as exc:  # a failure's proposal won that generation: recover as after one
            return exc.generation, str(exc)

    def _pace(self, until: float) -> tuple[int, str] | None:
        """Sleep until the next step is due; with a detector, in slices that consult it."""
        if self._watch is None:
            if (spare := until - self.clock()) > 0:
                self.sleep(spare)
            return None
        while (spare := until - self.clock()) > 0:
            self.sleep(min(spare, PACE_SLICE_S))
            if (reason := self._watch(0.0)) is not None:
                return self.group.generation, reason
        return None

    def _consult(self, waited_s: float) -> str | None:
        """The watch: a reason to stop waiting if a member is suspect; reports stragglers."""
        assert self.detector is not None and self.policy.detector is not None
        gen, members = self.group.generation, self.group.members
        suspicions = self.detector.judge(members, gen)
        now = self.clock()
        for peer in set(self._suspected_at) - {s.peer for s in suspicions}:
            del self._suspected_at[peer]  # it spoke again: a later silence starts a new grace
        for s in suspicions:
            self._suspected_at.setdefault(s.peer, now)
            if (gen, s.peer, s.via) not in self._reported:
                self._reported.add((gen, s.peer, s.via))
                self.recorder.emit("suspect", peer=s.peer, via=s.via, cause=s.via,
                                   silent_s=s.silent_s, gen=gen, waited_s=round(waited_s, 3))
        if suspicions:
            return suspicions[0].describe()
        key = ("straggler", gen, self.workload.step)
        if waited_s >= self.policy.detector.straggler_after and key not in self._reported:
            self._reported.add(key)
            slow = self.detector.stragglers(members) or [None]
            for peer in slow:
                self.recorder.emit("straggler", peer=getattr(peer, "peer", None),
                                   loss=getattr(peer, "loss", None),
                                   silent_s=getattr(peer, "silent_s", None),
                                   waited_s=round(waited_s, 3), gen=gen, step=self.workload.step)
        return None

    def _record_error(self, exc: CollectiveError, step: int, gen: int) -> None:
        self.recorder.emit("collective_error", step=step, gen=gen, phase=exc.phase,
                           cause=exc.cause, error=str(exc))

    # -- recovery --------------------------------------------------------------------------

    def _recover(self, failure: tuple[int, str]) -> Outcome | None:
        """Called outside any except block. Returns an outcome to exit with, or None to go on."""
        failed_gen, error = failure
        self._release()
        attempt = 0
        while True:
            attempt += 1
            if attempt > self.policy.max_retries:
                if not self.policy.breaker:
                    outcome = Outcome.FAILED_FAST if self.policy.max_retries == 0 else Outcome.RETRIES_EXHAUSTED
                    return self._shutdown(outcome, error)
                reason = f"retries exhausted after: {error}"
            else:
                delay = self.policy.backoff(attempt) + self.rng.uniform(*self.policy.jitter)
                self.recorder.emit("backoff", attempt=attempt, seconds=round(delay, 3))
                self.sleep(delay)
                ok, detail = self._health_check()
                self.recorder.emit("health_check", attempt=attempt, ok=ok, detail=detail)
                if not ok and not self.policy.breaker:
                    error = detail
                    continue
                reason = f"health check failed: {detail}"
                if ok:
                    proposal = self._reachable_members() if self.policy.elastic else None
                    self.recorder.emit("retry", attempt=attempt, after_gen=failed_gen)
                    try:
                        again = self._join(failed_gen, proposal)
                    except NotAMember as exc:
                        reason = f"left out: {exc}"
                    else:
                        if again is None:
                            return None
                        failed_gen, error = again
                        self._release()
                        continue
            # the breaker opens
            if not self.policy.rejoin:
                return self._shutdown(Outcome.ISOLATED, reason)
            back = self._wait_to_rejoin(reason)
            if back is None or isinstance(back, Outcome):
                return back
            (failed_gen, error), attempt = back, 0
            self._release()

    def _wait_to_rejoin(self, reason: str) -> Outcome | tuple[int, str] | None:
        """Breaker open with rejoin: free what the rank holds, ask to be let back in once the
        control plane hears it, join the generation that admits it. Returns None when back
        in a working group, the failure if that generation failed, or the outcome to exit
        with when nobody let it in within rejoin_within."""
        opened = self.clock()
        self._open_breaker(reason)
        deadline = opened + self.policy.rejoin_within
        asked = False
        while self.clock() < deadline:
            try:
                if not asked and self._health_check()[0]:
                    self.group.ask_to_rejoin()
                    asked = True
                    self.recorder.emit("rejoin_request", gen=self.group.generation)
                elif asked and (admission := self.group.admitted()) is not None:
                    gen, members = admission
                    self.recorder.emit("rejoin_admitted", gen=gen,
                                       waited_s=round(self.clock() - opened, 3))
                    return self._join(gen - 1, members)
            except CollectiveError as exc:  # the store went away again: ask anew when back
                self.recorder.emit("rejoin_failed", error=str(exc))
                asked = False
            except NotAMember:  # that generation went on without this rank: ask again
                asked = False
            self.sleep(MEMBERSHIP_POLL_S)
        self.recorder.emit("rejoin_gave_up", waited_s=round(self.clock() - opened, 3))
        return Outcome.ISOLATED

    def _health_check(self) -> tuple[bool, str]:
        if self.detector is None:
            return self.group.health_check(self.policy.health_check_timeout)
        cut_off = [s for s in self.detector.judge((self.group.member,), -1) if s.via == "cut-off"]
        if cut_off:
            return False, cut_off[0].describe()
        return True, "digests arrive from the control plane"

    def _reachable_members(self) -> tuple[int, ...]:
        """The current members less those gone: a rank whose process ended at once, a
        silent one once it has been suspect for `exclude_after` (it may speak again)."""
        assert self.detector is not None
        members = self.group.members
        while True:
            now = self.clock()
            gone = {s.peer: s for s in self.detector.judge(members, -1)
                    if s.via in ("connection", "heartbeat")}
            for peer in gone:
                self._suspected_at.setdefault(peer, now)
            silent_since = [self._suspected_at[p] for p, s in gone.items() if s.via == "heartbeat"]
            if not silent_since or now >= min(silent_since) + self.policy.exclude_after:
                break
            self.sleep(MEMBERSHIP_POLL_S)
        if gone:
            self.recorder.emit("exclude", peers=sorted(gone), gen=self.group.generation,
                               reasons={str(p): s.describe() for p, s in gone.items()})
        return tuple(m for m in members if m not in gone)

    def _join(self, failed_gen: int | None, proposal: tuple[int, ...] | None = None
              ) -> tuple[int, str] | None:
        """Join a generation and restore the agreed state; returns the failure if any.
        Raises NotAMember when the generation goes on without this rank."""
        started = self.clock()
        before = self.group.members
        try:
            gen = self.group.join(failed_gen, proposal,
                                  watch=self._watch if self.policy.elastic else None)
            self.recorder.emit("group_ready", gen=gen, world=self.group.world_size,
                               group_rank=self.group.rank, secs=round(self.clock() - started, 3))
            if self.group.members != before:
                self.recorder.emit("membership", gen=gen, world=self.group.world_size,
                                   members=list(self.group.members),
                                   left_out=sorted(set(before) - set(self.group.members)),
                                   joined=sorted(set(self.group.members) - set(before)))
            self._suspected_at.clear()
            self._restore()
        except CollectiveError as exc:
            self._record_error(exc, self.workload.step, self.group.generation)
            return self.group.generation, str(exc)
        return None

    def _restore(self) -> None:
        if self.policy.restore == "peer":
            self._restore_from_peer()
            return
        # All ranks load the same state: the newest checkpoint every rank can see (MIN).
        latest = self.checkpoints.latest()
        agreed = torch.tensor([-1 if latest is None else latest], dtype=torch.int64)
        self.group.all_reduce(agreed, "min", watch=self._watch)  # also proves the new group works
        step = int(agreed.item())
        if step < 0:
            self.workload.reset()
        else:
            self.workload.load_state(self.checkpoints.load(step))
        self.recorder.emit("restored", step=self.workload.step, gen=self.group.generation,
                           source="checkpoint")

    def _restore_from_peer(self) -> None:
        """All ranks take the newest in-memory state among them (a rank may be one step ahead
        when a collective failed half-way), sent by the lowest rank that holds it."""
        group, watch = self.group, self._watch
        newest = torch.tensor([self.workload.step], dtype=torch.int64)
        group.all_reduce(newest, "max", watch=watch)
        holds = self.workload.step == int(newest.item())
        source = torch.tensor([group.rank if holds else group.world_size], dtype=torch.int64)
        group.all_reduce(source, "min", watch=watch)
        src = int(source.item())
        payload = b""
        if group.rank == src:
            buffer = io.BytesIO()
            torch.save(self.workload.state(), buffer)
            payload = buffer.getvalue()
        size = torch.tensor([len(payload)], dtype=torch.int64)
        group.all_reduce(size, "max", watch=watch)
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload
                else torch.empty(int(size.item()), dtype=torch.uint8))
        group.broadcast(data, src, watch=watch)
        if group.rank != src:
            self.workload.load_state(torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True))
        self.recorder.emit("restored", step=self.workload.step, gen=group.generation,
                           source="peer", peer=group.members[src], bytes=int(size.item()))

    def _release(self) -> None:
        secs = self.group.leave()
        self.recorder.emit("group_released", secs=round(secs, 3))

    def _shutdown(self, outcome: Outcome, reason: str) -> Outcome:
        """Leave for good: breaker event if it opened, then free what the rank holds."""
        if outcome is Outcome.ISOLATED:
            self._open_breaker(reason)
        else:
            self._free(outcome)
        return outcome

    def _open_breaker(self, reason: str) -> None:
        self.recorder.emit("breaker_open", reason=reason)
        self._free(Outcome.ISOLATED)

    def _free(self, outcome: Outcome) -> None:
        self.recorder.emit("resources_released", outcome=outcome.value, group=True,
                           **self.free_accelerator())
