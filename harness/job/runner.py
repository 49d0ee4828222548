"""The fault-tolerant runner: the document's `DistributedFaultTolerantRunner`, done right.

A loop over named states; each state does its work and names the next one:

    STEPPING      run a step ── ok ──> checkpoint every K steps, pace ──> STEPPING
                  (max_steps reached: DONE, stopped); a collective failed ──> release the
                  group (outside the except block, so no traceback keeps its sockets
                  open) ──> BACKOFF
    BACKOFF       count a try; none left ──> breaker? BREAKER_OPEN : free accelerator
                  memory, DONE (failed-fast | retries-exhausted); else sleep
                  base*2^n (capped) + jitter ──> HEALTH_CHECK
    HEALTH_CHECK  pass ──> REGROUP; fail ──> breaker? BREAKER_OPEN : BACKOFF
    REGROUP       join the next generation, restore the state the ranks agree on (the
                  newest checkpoint rank 0 has, or a peer's: harness.job.restore) ──> STEPPING
                  with a fresh budget of tries; failed ──> release, BACKOFF (the try
                  counts); the generation went on without this rank ──> BREAKER_OPEN
    BREAKER_OPEN  free the group and accelerator memory ──> DONE (isolated), or with
                  rejoin ──> REJOIN
    REJOIN        wait to be let back in ──> STEPPING (the breaker closes); nobody let it
                  in within rejoin_within ──> DONE (isolated)

A failure is a `Failure` value and every end an `ExitReason` (harness.job.outcome).

With a failure detector (policy `detector`), every wait (a collective, a rendezvous of an
elastic policy, the pacing sleep between steps) asks it every few tens of milliseconds
whether a member is suspect (harness.job.suspicion keeps what it said); if so the wait
ends at once (the stuck collective is abandoned to a reaper: see harness.job.group) and
recovery starts, without waiting for the collective timeout. The health check is then
"digests arrive from the control plane". An elastic policy also decides the next
membership in REGROUP:

    suspect members ─> wait up to exclude_after for the silent ones to speak again
       (a rank whose process is gone is left out at once) ─> propose the others
       ─> the first proposal of the generation wins (control plane) ─> left out? open the
       breaker and leave : renumber, restore the newest in-memory state of a peer, go on

With `rejoin`, a rank whose breaker opened frees what it holds but stays (REJOIN):

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
import errno
import functools
import random
import time
from typing import Any, Callable

import torch

from harness import signals
from harness.job.checkpoint import Checkpointer
from harness.job.detector import FailureDetector
from harness.job.group import CollectiveError, Group, NotAMember
from harness.job.outcome import ExitReason, Failure
from harness.job.policies import PolicySpec
from harness.job.restore import NoReadableCheckpoint, restore_strategy
from harness.job.suspicion import Suspicions
from harness.job.workload import Workload
from runfolder import events as kinds
from runfolder.events import EventRecorder

PACE_SLICE_S = 0.02      # the pacing sleep asks the detector this often
MEMBERSHIP_POLL_S = 0.05  # while waiting for a silent member to speak again, or to be let in


class State(enum.Enum):
    """Where the runner is; the module docstring says what each state does and leads to."""

    STEPPING = "stepping"
    BACKOFF = "backoff"
    HEALTH_CHECK = "health-check"
    REGROUP = "regroup"
    BREAKER_OPEN = "breaker-open"
    REJOIN = "rejoin"
    DONE = "done"


def clear_blas_workspaces() -> None:
    """Drop cuBLAS's workspaces, which torch allocates through its caching allocator and
    keeps per stream: on the first GPU run 66-68 MiB stayed reserved after empty_cache."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def free_accelerator_memory(cuda: Any = torch.cuda,
                            clear_workspaces: Callable[[], None] = clear_blas_workspaces) -> dict[str, int | None]:
    """Hand cached accelerator memory back (cuBLAS's workspaces, then `empty_cache`);
    measured before and after with the allocator (reserved) and the driver (free, of
    mem_get_info). None without CUDA."""
    if not cuda.is_available():
        return {"cuda_reserved_before": None, "cuda_reserved_after": None,
                "cuda_free_before": None, "cuda_free_after": None}
    reserved_before, (free_before, _) = cuda.memory_reserved(), cuda.mem_get_info()
    clear_workspaces()
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
                 free_accelerator: Callable[[], dict[str, int | None]] = free_accelerator_memory,
                 step_delay: Callable[[], float] = lambda: 0.0) -> None:
        self.policy = policy
        self.step_delay = step_delay  # a step_delay fault's wait before each step (harness.job.stepdelay)
        self.group = group
        self.workload = workload
        self.checkpoints = checkpoints
        self.recorder = recorder
        self.rng = rng
        self.sleep = sleep
        self.clock = clock
        self.free_accelerator = free_accelerator
        self.restore = restore_strategy(policy.restore, checkpoints)
        self.suspicions = (None if detector is None or policy.detector is None else
                           Suspicions(detector, recorder, clock, policy.detector.straggler_after,
                                      policy.exclude_after))
        self._watch = self._consult if self.suspicions is not None else None
        self.max_steps: int | None = None
        self.exit_reason: ExitReason | None = None  # set when the state is DONE
        self._failure: Failure | None = None        # the latest failure recovered from
        self._tries = 0                             # since the last working group or breaker
        self._breaker_reason = ""
        self._breaker_opened = 0.0
        self._move_on = False  # rejoin: every member moves to the next generation after this step
        self._stepped = False  # the process's first step carries the CPU seconds its start took
        self._handlers: dict[State, Callable[[], State]] = {
            State.STEPPING: self._stepping, State.BACKOFF: self._backoff,
            State.HEALTH_CHECK: self._checking_health, State.REGROUP: self._regrouping,
            State.BREAKER_OPEN: self._breaker_open, State.REJOIN: self._rejoining}

    # -- the loop ------------------------------------------------------------------------

    def run(self, max_steps: int | None = None) -> ExitReason:
        state = self.start(max_steps)
        while state is not State.DONE:
            signals.check()  # a SIGTERM whose exception a finalizer swallowed: stop all the same
            state = self.advance(state)
        assert self.exit_reason is not None
        return self.exit_reason

    def start(self, max_steps: int | None = None) -> State:
        """Join the first generation; returns the state to go on from."""
        self.max_steps = max_steps
        return self._after(self._join(None))

    def advance(self, state: State) -> State:
        """Do one state's work; returns the next state (DONE: `exit_reason` says why)."""
        return self._handlers[state]()

    def _after(self, failure: Failure | None) -> State:
        """After a join or a step: go on stepping, or release the group and back off."""
        if failure is None:
            self._tries = 0
            return State.STEPPING
        self._failure = failure
        self._release()
        return State.BACKOFF

    def _done(self, reason: ExitReason) -> State:
        self.exit_reason = reason
        return State.DONE

    # -- stepping --------------------------------------------------------------------------

    def _stepping(self) -> State:
        if self.max_steps is not None and self.workload.step >= self.max_steps:
            return self._done(ExitReason.STOPPED)
        return self._after(self._step())

    def _step(self) -> Failure | None:
        """One paced training step; returns the failure if a collective failed."""
        if (delay := self.step_delay()) > 0:  # a slow input pipeline, before the step its `dur` times
            self.sleep(delay)
        started = self.clock()
        step, gen = self.workload.step, self.group.generation
        reduce = functools.partial(self.group.all_reduce, watch=self._watch)
        try:
            if self.policy.rejoin:
                reduce = functools.partial(self._reduce_and_tell, reduce, self._admission())
            loss = self.workload.train_step(reduce, self.group.world_size)
        except CollectiveError as exc:
            failure = self._record(Failure.of(exc, step, gen))
            if not self.policy.catch_errors:
                raise
            return failure
        first = {} if self._stepped else {"cpu_s": round(time.process_time(), 3)}
        self._stepped = True
        self.recorder.emit(kinds.STEP, step=step, gen=gen, loss=round(loss, 5),
                           dur=round(self.clock() - started, 4), compute=round(self.workload.compute_s, 5), **first)
        if self.suspicions is not None:
            self.suspicions.stepped()
        if self.workload.step % self.workload.spec.state_every == 0:
            self._record_state("step")
        if self.group.rank == 0 and self.workload.step % self.workload.spec.checkpoint_every == 0:
            self._checkpoint()
        if self._move_on:
            return self._move_to_next_generation(gen)
        return self._pace(started + self.workload.spec.step_period)

    def _checkpoint(self) -> None:
        """Save the state; a save the disk refuses (full, read-only) leaves the newest
        durable checkpoint the one to restore, and training goes on to the next save."""
        state = self.workload.state()
        # a fault may be anchored on it: it comes as the writing begins, not before the copy
        self.recorder.emit(kinds.CHECKPOINT_BEGIN, step=self.workload.step)
        try:
            self.checkpoints.save(self.workload.step, state)
        except OSError as exc:
            self.recorder.emit(kinds.CHECKPOINT_FAILED, step=self.workload.step,
                               errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)), error=str(exc))
            return
        self.recorder.emit(kinds.CHECKPOINT, step=self.workload.step)

    def _admission(self) -> bool:
        """Group rank 0: ranks asking to rejoin? Agree the next generation with them in."""
        if self.group.rank != 0 or not (asking := self.group.rejoin_requests()):
            return False
        admitted = sorted(set(self.group.admit(asking)) & set(asking))
        if admitted:
            self.recorder.emit(kinds.ADMIT, peers=admitted, gen=self.group.generation + 1)
        return bool(admitted)

    def _reduce_and_tell(self, reduce: Callable[[torch.Tensor], None], admitting: bool,
                         flat: torch.Tensor) -> None:
        """The gradient all-reduce with one more element, non-zero when group rank 0 admits
        ranks: every member learns it from the same step, so all move on after it."""
        buffer = torch.cat([flat, flat.new_tensor([1.0 if admitting else 0.0])])
        reduce(buffer)
        flat.copy_(buffer[:-1])
        self._move_on = bool(buffer[-1].item() > 0)

    def _move_to_next_generation(self, gen: int) -> Failure | None:
        """To the next generation, whose members group rank 0 agreed (ranks rejoining)."""
        self._move_on = False
        self._release()
        try:
            return self._join(gen)
        except NotAMember as exc:  # a failure's proposal won that generation: recover as after one
            return Failure(self.workload.step, exc.generation, "join", "left-out", str(exc))

    def _pace(self, until: float) -> Failure | None:
        """Sleep until the next step is due; with a detector, in slices that consult it.
        With rejoin, a rank asking back ends the sleep: every member hears of it in the
        same digest, so the step whose all-reduce tells them of its admission starts now
        rather than up to a step period later."""
        if self._watch is None:
            if (spare := until - self.clock()) > 0:
                self.sleep(spare)
            return None
        assert self.suspicions is not None
        while (spare := until - self.clock()) > 0:
            self.sleep(min(spare, PACE_SLICE_S))
            if (reason := self._watch(0.0)) is not None:
                return Failure(self.workload.step, self.group.generation, "pace", "suspect", reason)
            if self.policy.rejoin and self.suspicions.rejoin_asked():
                return None
        return None

    def _consult(self, waited_s: float) -> str | None:
        """The watch: a reason to stop waiting if a member is suspect."""
        assert self.suspicions is not None
        return self.suspicions.watch(self.group.generation, self.group.members,
                                     self.workload.step, waited_s)

    def _record(self, failure: Failure) -> Failure:
        self.recorder.emit(kinds.COLLECTIVE_ERROR, step=failure.step, gen=failure.generation,
                           phase=failure.phase, cause=failure.cause, error=failure.error)
        return failure

    # -- recovery --------------------------------------------------------------------------

    def _backoff(self) -> State:
        """Count a try; with none left give up (or open the breaker), else wait before it."""
        assert self._failure is not None
        self._tries += 1
        if self._tries > self.policy.max_retries:
            if self.policy.breaker:
                return self._open_breaker(f"retries exhausted after: {self._failure.error}")
            reason = (ExitReason.FAILED_FAST if self.policy.max_retries == 0
                      else ExitReason.RETRIES_EXHAUSTED)
            self._free(reason)
            return self._done(reason)
        delay = self.policy.backoff(self._tries) + self.rng.uniform(*self.policy.jitter)
        self.recorder.emit(kinds.BACKOFF, attempt=self._tries, seconds=round(delay, 3))
        self.sleep(delay)
        return State.HEALTH_CHECK

    def _checking_health(self) -> State:
        ok, detail = self._health_check()
        self.recorder.emit(kinds.HEALTH_CHECK, attempt=self._tries, ok=ok, detail=detail)
        if ok:
            return State.REGROUP
        if self.policy.breaker:
            return self._open_breaker(f"health check failed: {detail}")
        return State.BACKOFF

    def _regrouping(self) -> State:
        assert self._failure is not None
        proposal = self._reachable_members() if self.policy.elastic else None
        self.recorder.emit(kinds.RETRY, attempt=self._tries, after_gen=self._failure.generation)
        try:
            failure = self._join(self._failure.generation, proposal)
        except NotAMember as exc:
            return self._open_breaker(f"left out: {exc}")
        return self._after(failure)

    def _open_breaker(self, reason: str) -> State:
        self._breaker_reason = reason
        return State.BREAKER_OPEN

    def _breaker_open(self) -> State:
        """Free what the rank holds; leave, or with rejoin wait to be let back in."""
        self._breaker_opened = self.clock()
        self.recorder.emit(kinds.BREAKER_OPEN, reason=self._breaker_reason)
        self._free(ExitReason.ISOLATED)
        return State.REJOIN if self.policy.rejoin else self._done(ExitReason.ISOLATED)

    def _rejoining(self) -> State:
        """Ask to be let back in once the control plane hears this rank, and join the
        generation that admits it; nobody let it in within rejoin_within: leave."""
        asked = False
        while self.clock() < self._breaker_opened + self.policy.rejoin_within:
            try:
                if not asked and self._health_check()[0]:
                    self.group.ask_to_rejoin()
                    asked = True
                    self.recorder.emit(kinds.REJOIN_REQUEST, gen=self.group.generation)
                elif asked and (admission := self.group.admitted()) is not None:
                    gen, members = admission
                    self.recorder.emit(kinds.REJOIN_ADMITTED, gen=gen,
                                       waited_s=round(self.clock() - self._breaker_opened, 3))
                    failure = self._join(gen - 1, members)
                    break
            except CollectiveError as exc:  # the store went away again: ask anew when back
                self.recorder.emit(kinds.REJOIN_FAILED, error=str(exc))
                asked = False
            except NotAMember:  # that generation went on without this rank: ask again
                asked = False
            self.sleep(MEMBERSHIP_POLL_S)
        else:
            self.recorder.emit(kinds.REJOIN_GAVE_UP,
                               waited_s=round(self.clock() - self._breaker_opened, 3))
            return self._done(ExitReason.ISOLATED)
        self._tries = 0  # the breaker closed: a fresh budget of tries
        return self._after(failure)

    def _health_check(self) -> tuple[bool, str]:
        if self.suspicions is None:
            return self.group.health_check(self.policy.health_check_timeout)
        if (cut_off := self.suspicions.cut_off(self.group.member)) is not None:
            return False, cut_off.describe()
        return True, "digests arrive from the control plane"

    def _reachable_members(self) -> tuple[int, ...]:
        """The current members less those gone: a rank whose process ended at once, a
        silent one once it has been suspect for `exclude_after` (it may speak again)."""
        assert self.suspicions is not None
        members = self.group.members
        while not (exclusion := self.suspicions.exclusion(members)).settled:
            self.sleep(MEMBERSHIP_POLL_S)
        if exclusion.gone:
            self.recorder.emit(kinds.EXCLUDE, peers=exclusion.peers, gen=self.group.generation,
                               reasons={str(s.peer): s.describe() for s in exclusion.gone})
        return tuple(m for m in members if m not in exclusion.peers)

    # -- groups and what a rank holds -------------------------------------------------------

    def _join(self, failed_gen: int | None, proposal: tuple[int, ...] | None = None
              ) -> Failure | None:
        """Join a generation and restore the agreed state; returns the failure if any.
        Raises NotAMember when the generation goes on without this rank."""
        started = self.clock()
        before = self.group.members
        try:
            gen = self.group.join(failed_gen, proposal,
                                  watch=self._watch if self.policy.elastic else None)
            self.recorder.emit(kinds.GROUP_READY, gen=gen, world=self.group.world_size,
                               group_rank=self.group.rank, secs=round(self.clock() - started, 3))
            if self.group.members != before:
                self.recorder.emit(kinds.MEMBERSHIP, gen=gen, world=self.group.world_size,
                                   members=list(self.group.members),
                                   left_out=sorted(set(before) - set(self.group.members)),
                                   joined=sorted(set(self.group.members) - set(before)))
            if self.suspicions is not None:
                self.suspicions.generation_formed()
            try:
                restored = self.restore.restore(self.group, self.workload, self._watch)
            except NoReadableCheckpoint as exc:  # the rank ends crashed; the state checker reads why
                self.recorder.emit(kinds.RESTORE_FAILED, gen=self.group.generation, **exc.fields())
                raise
            self.recorder.emit(kinds.RESTORED, step=self.workload.step, gen=self.group.generation,
                               **restored.fields())
            self._record_state("restore")
        except CollectiveError as exc:
            return self._record(Failure.of(exc, self.workload.step, self.group.generation))
        return None

    def _record_state(self, at: str) -> None:
        """The fingerprint of this rank's state (reports.state judges them across ranks)."""
        params, optim = self.workload.fingerprints()
        self.recorder.emit(kinds.STATE, step=self.workload.step, gen=self.group.generation, at=at,
                           fingerprint=params, optim=optim)

    def _release(self) -> None:
        secs = self.group.leave()
        self.recorder.emit(kinds.GROUP_RELEASED, secs=round(secs, 3))

    def _free(self, reason: ExitReason) -> None:
        self.recorder.emit(kinds.RESOURCES_RELEASED, outcome=reason.value, group=True,
                           **self.free_accelerator())
